# shellcheck shell=bash
# kind_node_conflist SUBNET GATEWAY: a kind node's Pod network, the CNI
# configuration the node image carries for one node (hack/kind-node.sh) and
# hack/kind.sh writes per node on a cluster of many: the bridge warmpool0 as
# the pods' gateway, host-local addresses from SUBNET, and host ports
# (kube-router enforces NetworkPolicy on it; pods' packets routed off the node
# are dropped by the scripts' mangle rule).
kind_node_conflist() {
  local subnet=$1 gateway=$2
  cat <<JSON
{
  "cniVersion": "0.4.0",
  "name": "warmpool",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "warmpool0",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$subnet", "gateway": "$gateway"}]],
        "routes": [{"dst": "0.0.0.0/0", "gw": "$gateway"}]
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
JSON
}
