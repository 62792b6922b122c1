# shellcheck shell=bash
# scripts/kubeconfig.sh: sourced by kube-control-plane.sh and kube-node.sh (not run).
# write_kubeconfig FILE CLUSTER SERVER CA USER CERT KEY
#   a kubeconfig with one cluster, one client-certificate user and the context of both
write_kubeconfig() {
  cat >"$1" <<KC
apiVersion: v1
kind: Config
clusters:
- name: $2
  cluster:
    server: $3
    certificate-authority: $4
users:
- name: $5
  user:
    client-certificate: $6
    client-key: $7
contexts:
- name: $2
  context: {cluster: $2, user: $5}
current-context: $2
KC
}
