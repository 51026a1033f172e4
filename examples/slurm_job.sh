#!/bin/bash
# A Slurm job that trains on clairfs: one daemon per node mounts the data set, every rank reads it as
# an ordinary directory, and the mounts go away when training ends.
#SBATCH --job-name=train-clairfs
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=4
#SBATCH --time=04:00:00
set -euo pipefail

DATA=/lustre/datasets/imagenet/train      # SOURCE: the shared copy
MNT=/tmp/$SLURM_JOB_ID-train              # node-local mount point, the same path on every node
NVME=/local/scratch                       # node-local disk for the NVMe tier
RANKS_PER_NODE=$SLURM_NTASKS_PER_NODE
WORLD=$SLURM_NTASKS
# The loader's settings, the same as train.py passes to DistributedSampler and DataLoader.
OPTS="seed=42,batch_size=256,workers=8,epochs=90,world_size=$WORLD,ranks_per_node=$RANKS_PER_NODE"
OPTS="$OPTS,ram=64G,nvme=$NVME,nvme_size=800G"

srun --ntasks-per-node=1 mkdir -p "$MNT"
# One daemon per node (its node index is its rank in this step). --kill-on-bad-exit=0: a node whose
# daemon fails does not take the others down; its files then come from SOURCE.
clairfs-job-mount -- srun --ntasks-per-node=1 --kill-on-bad-exit=0 clairfs "$DATA" "$MNT" -o "$OPTS"
trap 'clairfs-job-umount' EXIT

# Training is unchanged: it reads $MNT as it would read $DATA.
srun python train.py --data "$MNT" --seed 42 --batch-size 256 --workers 8 --epochs 90
