#!/bin/bash
# A Slurm job that trains on clairfs: one daemon per node mounts the data set, every rank reads it as
# an ordinary directory, and the mounts go away when training ends — or when the job is cancelled or
# hits its time limit.
#
# Works as shipped on Slurm 22.05 and later with MPICH (srun --mpi=pmi2; see docs/mounting.md for
# Open MPI and other versions). clairfs-job-mount starts the daemons with
#   srun -N NODES -n NODES --ntasks-per-node=1 --overlap --mpi=pmi2 --kill-on-bad-exit=0 clairfs ...
# (one daemon per node whatever the job's layout, sharing the CPUs of the training step) and returns
# once every node is mounted; clairfs-job-umount stops them and checks every node.
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
# RAM for staging: a quarter of the memory the job may use, by default (ram=SIZE to choose; more than
# the node or the job's cgroup has is refused at mount).
OPTS="$OPTS,nvme=$NVME,nvme_size=800G"

clairfs-job-mount "$DATA" "$MNT" -o "$OPTS"
# At the end, however it comes. On scancel or the time limit Slurm sends SIGTERM to every daemon, which
# stops cleanly by itself, and to this script, which still runs the trap.
trap 'clairfs-job-umount' EXIT

# Training is unchanged: it reads $MNT as it would read $DATA.
srun python train.py --data "$MNT" --seed 42 --batch-size 256 --workers 8 --epochs 90
