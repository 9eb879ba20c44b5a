#!/usr/bin/env bash
# Pod networking across the nodes of a podman kind cluster (hack/kind/cluster.yaml), without a
# CNI daemon: each node's ptp CNI hands out addresses from the podCIDR the controller manager
# gave that node, and each node routes every other node's podCIDR through that node's address
# on the cluster's bridge (the nodes share one L2 network, so a next hop is all a route needs).
# The node image ships a ptp config for 10.244.0.0/24, which is the control plane's podCIDR;
# run this right after `kind create cluster`, before any pod outside the host network exists.
#
#   hack/kind/pod-network.sh KUBECTL      (KUBECONFIG points at the cluster; the nodes are podman
#                                          containers named as the Nodes, as kind names them)
set -euo pipefail
KUBECTL=${1:?usage: $0 KUBECTL}
CONF=/etc/cni/net.d/10-pdmtp-ptp.conflist

# name podCIDR InternalIP, one node per line
mapfile -t NODES < <("$KUBECTL" get nodes -o jsonpath='{range .items[*]}{.metadata.name} {.spec.podCIDR} {.status.addresses[?(@.type=="InternalIP")].address}{"\n"}{end}')
((${#NODES[@]} > 0)) || { echo "error: no nodes" >&2; exit 1; }
for line in "${NODES[@]}"; do
  read -r name cidr ip <<<"$line"
  [[ -n $cidr && -n $ip ]] || { echo "error: node $name has no podCIDR or InternalIP ($line)" >&2; exit 1; }
done

for line in "${NODES[@]}"; do
  read -r name cidr _ <<<"$line"
  # The image's config with this node's range; containerd reloads a changed CNI config itself.
  podman exec "$name" sh -c "sed 's|\"subnet\": \"[^\"]*\"|\"subnet\": \"$cidr\"|' $CONF >$CONF.new && mv $CONF.new $CONF"
  podman exec "$name" grep -q "\"subnet\": \"$cidr\"" "$CONF" ||
    { echo "error: $name: $CONF does not carry $cidr" >&2; exit 1; }
  for other in "${NODES[@]}"; do
    read -r other_name other_cidr other_ip <<<"$other"
    [[ $other_name == "$name" ]] && continue
    podman exec "$name" ip route replace "$other_cidr" via "$other_ip"
  done
  echo "$name: pods from $cidr, routes to $((${#NODES[@]} - 1)) other node(s)"
done
