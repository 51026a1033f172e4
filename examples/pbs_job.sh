#!/bin/bash
# A PBS Pro / OpenPBS job that trains on clairfs with MPICH's mpiexec: one daemon per node, every rank
# reads the mount as an ordinary directory, the mounts go away when training ends.
#PBS -N train-clairfs
#PBS -l select=4:ncpus=32:mpiprocs=4
#PBS -l walltime=04:00:00
set -euo pipefail
cd "$PBS_O_WORKDIR"

DATA=/lustre/datasets/imagenet/train
MNT=/tmp/$PBS_JOBID-train
NVME=/local/scratch
NODES=$(sort -u "$PBS_NODEFILE" | wc -l)
WORLD=$(wc -l < "$PBS_NODEFILE")
OPTS="seed=42,batch_size=256,workers=8,epochs=90,world_size=$WORLD,ranks_per_node=$((WORLD / NODES))"
OPTS="$OPTS,ram=64G,nvme=$NVME,nvme_size=800G"

mpiexec -n "$NODES" -ppn 1 mkdir -p "$MNT"
# -disable-auto-cleanup: a node whose daemon fails does not take the others down.
clairfs-job-mount -- mpiexec -n "$NODES" -ppn 1 -disable-auto-cleanup clairfs "$DATA" "$MNT" -o "$OPTS"
trap 'clairfs-job-umount' EXIT

mpiexec -n "$WORLD" -ppn $((WORLD / NODES)) python train.py --data "$MNT" --seed 42 --batch-size 256 \
  --workers 8 --epochs 90
