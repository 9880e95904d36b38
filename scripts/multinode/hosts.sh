# Sourced by the multi-node scripts (run.sh, local_sgd.sh), whose two "hosts" node0 and node1
# are containers of one node image on a private Docker bridge network, with root login over ssh
# between them.
#
#   hosts_init PREFIX        names this run's hosts PREFIX-<pid>-node0 and -node1 (`id`), their
#                            network (`net`) and a scratch folder (`work`), and removes all
#                            three when the script exits
#   hosts_keys DIR IMAGE     makes a key for this run into DIR (which the hosts mount read-only
#                            as root's ~/.ssh), inside IMAGE, which has ssh-keygen
#   hosts_wait_ssh PREFIX    waits until PREFIX-node0 can run a command on node1 through ssh
#                            (sshd is up); returns non-zero if it cannot after 10 s

hosts_init() {
  id="$1-$$"
  net="$id-net"
  work="$(mktemp -d)"
  trap 'docker rm -f "$id-node0" "$id-node1" >/dev/null 2>&1 || true
        docker network rm "$net" >/dev/null 2>&1 || true
        rm -rf "$work"' EXIT
}

hosts_keys() {
  mkdir -m 700 "$1"
  docker run --rm -v "$1:/k" "$2" sh -c "ssh-keygen -q -t ed25519 -N '' -C p2ptrain-multinode -f /k/id_ed25519 \
    && cp /k/id_ed25519.pub /k/authorized_keys \
    && printf 'Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  ConnectTimeout 10\n' >/k/config \
    && chmod 600 /k/*"
}

hosts_wait_ssh() {
  for _ in $(seq 1 50); do
    docker exec "$1-node0" ssh node1 true 2>/dev/null && return 0
    sleep 0.2
  done
  docker exec "$1-node0" ssh node1 hostname >/dev/null
}
