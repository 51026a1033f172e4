#!/bin/bash
# Slurm Epilog: removes what examples/slurm_prolog.sh made for a job on this node — the mount, its
# daemon (it exits when its mount ends, removing its NVMe folder), and /run/clairfs-jobs/$SLURM_JOB_ID —
# however the job ended (done, failed, cancelled, out of time). A job without the prolog's folder is
# left alone. Exits 1 only if something stays (Slurm then drains the node: a mount left behind is for
# an admin to see). CLAIRFS=PATH names the clairfs binary (default: the one on PATH).
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin  # (Slurm gives prologs none)

job=${SLURM_JOB_ID:?}
[[ "$job" =~ ^[0-9]+$ ]] || exit 0
dir=/run/clairfs-jobs/$job
[[ -d "$dir" && ! -L "$dir" ]] || exit 0
clairfs=${CLAIRFS:-$(command -v clairfs || echo /usr/local/bin/clairfs)}

# Unmounts a live mount, or clears a dead one (a daemon that was killed); never follows a link.
if [[ -d "$dir/mnt" && ! -L "$dir/mnt" ]] && grep -q " $dir/mnt fuse" /proc/self/mounts; then
  "$clairfs" cleanup "$dir/mnt" || echo "clairfs epilog: cleanup of $dir/mnt failed" >&2
fi
# The daemon ends with its mount; give it a moment before the folder goes.
for _ in $(seq 50); do
  pgrep -f -- " $dir/mnt" > /dev/null || break
  sleep 0.1
done
# --one-file-system: a mount still there is never descended into (and makes this fail).
rm -rf --one-file-system -- "$dir"
if [[ -e "$dir" ]]; then
  echo "clairfs epilog: $dir is still there (a mount that would not go?)" >&2
  exit 1
fi
exit 0
