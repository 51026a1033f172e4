#!/bin/bash
# A Slurm job that trains on a mount the site's prolog made (examples/slurm_prolog.sh): the comment
# asks for it, the mount is there when the script starts and staging has begun (start_batch=0: the job
# starts at an epoch's beginning, so the mount stages ahead before its first open); the epilog removes it.
# Compare examples/slurm_job.sh, which mounts from the job itself (and lets the nodes serve each other).
#SBATCH --job-name=train-clairfs
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=4
#SBATCH --time=04:00:00
#SBATCH --comment=clairfs:/lustre/datasets/imagenet/train:seed=42,start_batch=0,batch_size=256,workers=8,epochs=90,world_size=16,ranks_per_node=4
set -euo pipefail

MNT=/run/clairfs-jobs/$SLURM_JOB_ID/mnt
if [[ -e /run/clairfs-jobs/$SLURM_JOB_ID/error ]]; then
  cat /run/clairfs-jobs/$SLURM_JOB_ID/error >&2
  exit 1  # or read SOURCE directly: training still works, only without staging
fi

# Training is unchanged: it reads $MNT as it would read the data set.
srun python3 train.py --data "$MNT" --seed 42 --batch-size 256 --workers 8 --epochs 90
