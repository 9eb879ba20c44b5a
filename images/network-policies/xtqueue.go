// pdmtp addition to kube-network-policies, compiled into its networkpolicy package by
// hack/kind/build-network-policies.sh (the upstream source is otherwise unchanged).
//
// kube-network-policies sends the packets it must judge to userspace with nftables' `queue`
// expression, which lives in the kernel's nft_queue (CONFIG_NFT_QUEUE). Kernels built without it
// and without loadable modules refuse the rule ("Could not process rule: No such file or
// directory"), as the kind hosts here do. The same verdict exists as the xtables NFQUEUE target
// (CONFIG_NETFILTER_XT_TARGET_NFQUEUE), which nftables rules can carry through nft_compat
// (CONFIG_NFT_COMPAT): the rules stay the same, only their last expression changes.

package networkpolicy

import (
	"encoding/binary"

	"github.com/google/nftables/expr"
	"github.com/google/nftables/xt"
)

// xt_NFQUEUE revision 3 (linux/netfilter/xt_NFQUEUE.h, struct xt_NFQ_info_v3): queue number,
// queues total and flags, each a host-order u16, padded to xtables' 8-byte alignment.
const (
	xtNFQueueRevision   = 3
	xtNFQueueFlagBypass = 0x01 // NFQ_FLAG_BYPASS: accept when no program listens on the queue
)

func xtQueueInfo(num int, flags uint16) *xt.Unknown {
	info := make(xt.Unknown, 8)
	binary.NativeEndian.PutUint16(info[0:2], uint16(num))
	binary.NativeEndian.PutUint16(info[2:4], 1)
	binary.NativeEndian.PutUint16(info[4:6], flags)
	return &info
}

// xtQueue stands where upstream builds &expr.Queue{Num: num}.
func xtQueue(num int) *expr.Target {
	return &expr.Target{Name: "NFQUEUE", Rev: xtNFQueueRevision, Info: xtQueueInfo(num, 0)}
}

// xtQueueBypass stands where upstream sets expr.QueueFlagBypass (the --fail-open flag).
func xtQueueBypass(t *expr.Target) *expr.Target {
	info := []byte(*t.Info.(*xt.Unknown))
	t.Info = xtQueueInfo(int(binary.NativeEndian.Uint16(info[0:2])), xtNFQueueFlagBypass)
	return t
}
