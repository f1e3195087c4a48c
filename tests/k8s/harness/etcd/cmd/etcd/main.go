// A minimal single-member etcd for the gpufence Kubernetes test harness (embedded etcd server,
// plain http, loopback only). Runs until SIGINT/SIGTERM.
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"go.etcd.io/etcd/server/v3/embed"
)

// parseLoopbackURL accepts only http://127.0.0.1:<port> style URLs: the harness must never listen
// beyond the loopback interface.
func parseLoopbackURL(flagName, raw string) url.URL {
	u, err := url.Parse(raw)
	if err != nil {
		log.Fatalf("--%s %q: %v", flagName, raw, err)
	}
	ip := net.ParseIP(u.Hostname())
	if ip == nil || !ip.IsLoopback() || u.Port() == "" {
		log.Fatalf("--%s %q: must be a loopback IP with a port (e.g. http://127.0.0.1:2379)", flagName, raw)
	}
	return *u
}

func main() {
	dataDir := flag.String("data-dir", "", "etcd data directory (required)")
	name := flag.String("name", "default", "member name")
	listenClient := flag.String("listen-client-urls", "http://127.0.0.1:2379", "client URL to listen on")
	advertiseClient := flag.String("advertise-client-urls", "", "client URL to advertise (default: listen URL)")
	listenPeer := flag.String("listen-peer-urls", "http://127.0.0.1:2380", "peer URL to listen on")
	flag.Parse()
	if *dataDir == "" {
		log.Fatal("--data-dir is required")
	}
	if *advertiseClient == "" {
		*advertiseClient = *listenClient
	}

	cfg := embed.NewConfig()
	cfg.Name = *name
	cfg.Dir = *dataDir
	cfg.ListenClientUrls = []url.URL{parseLoopbackURL("listen-client-urls", *listenClient)}
	cfg.AdvertiseClientUrls = []url.URL{parseLoopbackURL("advertise-client-urls", *advertiseClient)}
	peer := parseLoopbackURL("listen-peer-urls", *listenPeer)
	cfg.ListenPeerUrls = []url.URL{peer}
	cfg.AdvertisePeerUrls = []url.URL{peer}
	cfg.InitialCluster = fmt.Sprintf("%s=%s", cfg.Name, peer.String())
	cfg.LogOutputs = []string{"stderr"}

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		log.Fatalf("start etcd: %v", err)
	}
	defer e.Close()

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGINT, syscall.SIGTERM)
	select {
	case <-e.Server.ReadyNotify():
		log.Printf("etcd ready, serving clients on %s", *listenClient)
	case err := <-e.Err():
		log.Fatalf("etcd: %v", err)
	case s := <-sig:
		log.Printf("etcd: %v before ready, stopping", s)
		return
	}
	select {
	case err := <-e.Err():
		log.Fatalf("etcd: %v", err)
	case s := <-sig:
		log.Printf("etcd: %v, stopping", s)
	}
}
