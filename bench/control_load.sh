#!/usr/bin/env bash
# What one user's processes reading the live control files in a loop cost the daemon: mounts SOURCE with
# allow_other,default_permissions, runs 20 loops of `cat stats metrics README` as USER for 10 s, and
# prints the CPU time the daemon used meanwhile (user + system, in seconds). Run as root.
#   bench/control_load.sh CLAIRFS SOURCE USER
set -euo pipefail
clairfs=$1 source=$2 user=$3
mnt=$(mktemp -d /tmp/clairfs-control-load.XXXXXX)
chmod 755 "$mnt"
"$clairfs" "$source" "$mnt" -o seed=1,allow_other,default_permissions
trap 'fusermount3 -u -z "$mnt"; rmdir "$mnt"' EXIT
pid=$(pgrep -f "clairfs $source $mnt" | head -1)
sleep 2
cpu() { awk '{print $14 + $15}' "/proc/$pid/stat"; }
before=$(cpu)
for _ in $(seq 20); do
  setpriv --reuid="$user" --regid="$(id -g "$user")" --clear-groups bash -c \
    "end=\$((SECONDS + 10)); while ((SECONDS < end)); do cat $mnt/.clairfs/stats $mnt/.clairfs/metrics $mnt/.clairfs/README >/dev/null; done" &
done
wait
echo "daemon CPU over 10 s of 20 loops by $user: $(awk -v t=$(($(cpu) - before)) -v hz="$(getconf CLK_TCK)" 'BEGIN { printf "%.2f", t / hz }') s"
