#!/bin/bash
# Slurm Prolog: mounts clairfs on each node of a job that asks for it, before the job starts, so staging
# begins while the job is still being set up; examples/slurm_epilog.sh removes it after the job.
#
# slurm.conf on every node:
#   Prolog=/etc/slurm/clairfs-prolog.sh
#   Epilog=/etc/slurm/clairfs-epilog.sh
#   PrologFlags=Alloc          (run at allocation, on every node of the job, before its script)
#
# A job asks with its comment, SOURCE (no ':' in it) and the mount options:
#   #SBATCH --comment=clairfs:/lustre/datasets/imagenet/train:seed=42,start_batch=0,batch_size=256,workers=8,world_size=16,ranks_per_node=4
# and reads /run/clairfs-jobs/$SLURM_JOB_ID/mnt. If the mount failed, the reason is in
# /run/clairfs-jobs/$SLURM_JOB_ID/error (the job decides: stop, or read SOURCE directly).
#
# The daemon runs as the job's user (runuser), so it reads SOURCE with that user's rights and nothing
# the comment says runs as root. Each node's daemon is on its own (no peers: a prolog has no launcher);
# ranks_per_node=N is turned into this node's ranks= from its place in the job's node list. A job
# without the comment is left alone. This script always exits 0: a user's wrong option must not drain
# the node. CLAIRFS=PATH names the clairfs binary (default: the one on PATH).
set -uo pipefail
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin  # (Slurm gives prologs none)
umask 022

spec=${SLURM_JOB_COMMENT:-}
[[ "$spec" == clairfs:* ]] || exit 0
job=${SLURM_JOB_ID:?}
[[ "$job" =~ ^[0-9]+$ ]] || exit 0
base=/run/clairfs-jobs
dir=$base/$job
clairfs=${CLAIRFS:-$(command -v clairfs || echo /usr/local/bin/clairfs)}

# The folders are root's (a user cannot swap them for a link); only the mount point is the user's, as
# fusermount3 needs.
mkdir -p -m 0755 "$base" && [[ -d "$base" && ! -L "$base" && $(stat -c %u "$base") == 0 ]] || exit 0
rm -rf --one-file-system -- "$dir"  # a folder of an earlier job of this number (a restarted controller)
mkdir -m 0755 "$dir" || exit 0
fail() {
  printf 'clairfs prolog on %s: %s\n' "${SLURMD_NODENAME:-$(hostname)}" "$1" > "$dir/error"
  exit 0
}

rest=${spec#clairfs:}
source=${rest%%:*}
[[ "$rest" == *:* ]] && options=${rest#*:} || options=""
[[ "$source" == /* ]] || fail "the comment must read clairfs:SOURCE:OPTIONS with an absolute SOURCE (got '$spec')"

# ranks_per_node=N: this node's N ranks, by its place in the job's node list (srun's block layout).
if [[ ",$options," =~ ,ranks[_-]per[_-]node=([0-9]+), ]]; then
  per=${BASH_REMATCH[1]}
  index=$(scontrol show hostnames "${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}" 2>/dev/null |
    grep -n -x -F -- "${SLURMD_NODENAME:-}" | cut -d: -f1)
  [[ -n "$index" ]] || fail "cannot place ${SLURMD_NODENAME:-this node} in the job's node list"
  first=$(((index - 1) * per))
  options=$(printf '%s' ",$options," | sed -E "s/,ranks[_-]per[_-]node=[0-9]+,/,ranks=$first-$((first + per - 1)),/")
  options=${options#,}
  options=${options%,}
fi

user=${SLURM_JOB_USER:?}
install -d -m 0700 -o "$user" -g "${SLURM_JOB_GID:-$(id -g "$user")}" "$dir/mnt" || fail "cannot make the mount point"
# A clean environment, and no terminal: the daemon detaches once the mount is live.
out=$(runuser -u "$user" -- env -i PATH=/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
  "$clairfs" "$source" "$dir/mnt" ${options:+-o "$options"} 2>&1 < /dev/null)
rc=$?
((rc == 0)) || fail "clairfs exited $rc: ${out//$'\n'/ }"
exit 0
