# Sourced by the scripts that run ranks on namespace "hosts" (hosts-bench.sh,
# roundtrip-check.sh): `hosts` network namespaces named "$tag-K", joined by veth pairs to a
# bridge in the root namespace, each with its own sshd on "$subnet.(K+1)". Sets `dir` (a
# scratch directory holding the keys, the daemons' files and `hosts`, one address per
# line) and `agent` (the ssh command that reaches them), and removes everything it made
# when the sourcing script exits. The caller sets `tag`, `subnet` and `hosts`; this needs
# root and iproute2, and installs openssh-server when it is missing.
[ "$(id -u)" -eq 0 ] || { echo "$(basename "$0" .sh): needs root" >&2; exit 3; }
if [ ! -x /usr/sbin/sshd ]; then
    apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y openssh-server openssh-client >/dev/null
fi
dir=$(mktemp -d)
cleanup() {
    for k in $(seq 0 $((hosts - 1))); do
        for pid in $(ip netns pids "$tag-$k" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
        ip netns del "$tag-$k" 2>/dev/null || true
    done
    ip link del "${tag}br" 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT
ip link add "${tag}br" type bridge
ip addr add "$subnet.254/24" dev "${tag}br"
ip link set "${tag}br" up
mkdir -p /run/sshd
ssh-keygen -q -t ed25519 -N '' -f "$dir/id"
ssh-keygen -q -t ed25519 -N '' -f "$dir/host"
cp "$dir/id.pub" "$dir/authorized_keys"
for k in $(seq 0 $((hosts - 1))); do
    ip netns add "$tag-$k"
    ip link add "${tag}o$k" type veth peer name "${tag}i$k"
    ip link set "${tag}i$k" netns "$tag-$k"
    ip link set "${tag}o$k" master "${tag}br"
    ip link set "${tag}o$k" up
    ip -n "$tag-$k" addr add "$subnet.$((k + 1))/24" dev "${tag}i$k"
    ip -n "$tag-$k" link set "${tag}i$k" up
    ip -n "$tag-$k" link set lo up
    cat >"$dir/sshd-$k.conf" <<CONF
ListenAddress $subnet.$((k + 1))
HostKey $dir/host
AuthorizedKeysFile $dir/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
UsePAM no
StrictModes no
PidFile $dir/sshd-$k.pid
CONF
    ip netns exec "$tag-$k" /usr/sbin/sshd -f "$dir/sshd-$k.conf"
done
agent="ssh -F /dev/null -i $dir/id -o BatchMode=yes -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
for k in $(seq 0 $((hosts - 1))); do
    for _ in $(seq 50); do $agent "$subnet.$((k + 1))" true 2>/dev/null && break; sleep 0.1; done
    echo "$subnet.$((k + 1))" >>"$dir/hosts"
done
