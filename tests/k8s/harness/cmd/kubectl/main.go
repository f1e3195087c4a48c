// kubectl for the gpufence Kubernetes test harness (the README's walk-through), built from the
// k8s.io/kubectl staging module that k8s.io/kubernetes pins.
package main

import (
	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"
	"k8s.io/kubectl/pkg/cmd/util"
)

func main() {
	command := cmd.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		util.CheckErr(err)
	}
}
