"""gpufence on Kubernetes: a secondary scheduler for the pods that name it (docs/kubernetes.md).

It calls the same scheduling core as the simulator and the local control plane: Nodes and Pods
observed through the API server become the core's cluster model and events; its decisions
become binds, pending reasons and pod deletions. The API server is the store.
"""
