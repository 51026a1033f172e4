#!/bin/bash
# A PBS Pro / OpenPBS job that trains on clairfs with MPICH's mpiexec: one daemon per node, every rank
# reads the mount as an ordinary directory, the mounts go away when training ends.
#
# clairfs-job-mount starts the daemons with
#   mpiexec -f <the job's hosts, once each> -n NODES -ppn 1 -disable-auto-cleanup clairfs ...
# and returns once every node is mounted; clairfs-job-umount unmounts each node (each daemon then ends
# cleanly, even when another node's daemon has died) and checks every node.
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
# RAM for staging: a quarter of the memory the job may use, by default (ram=SIZE to choose; more than
# the node or the job's cgroup has is refused at mount).
OPTS="$OPTS,nvme=$NVME,nvme_size=800G"

clairfs-job-mount "$DATA" "$MNT" -o "$OPTS"
trap 'clairfs-job-umount' EXIT

mpiexec -n "$WORLD" -ppn $((WORLD / NODES)) python train.py --data "$MNT" --seed 42 --batch-size 256 \
  --workers 8 --epochs 90
