// Command coredns is CoreDNS (github.com/coredns/coredns, at the release kubeadm deploys) linked
// with only the plugins the pdmtp kind cluster's Corefile uses (hack/kind/coredns.yaml).
// Deliberately absent: forward and loop. The cluster must never resolve a name outside itself
// (tests send traffic only to loopback and to the containers they made), so a name outside
// cluster.local gets SERVFAIL instead of a query to the host's resolvers.
package main

import (
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/loadbalance"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/metrics"
	_ "github.com/coredns/coredns/plugin/ready"
	_ "github.com/coredns/coredns/plugin/reload"

	"github.com/coredns/coredns/coremain"
)

func main() { coremain.Run() }
