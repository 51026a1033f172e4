#!/usr/bin/python3
"""A tf.data input pipeline that takes its order from the mount, so TensorFlow reads files in the order
clairfs stages them. Labels come from the class folder, as ImageFolder assigns them (sorted names).

    order_tf_data.py MOUNTPOINT [--epochs 2] [--rank 0] [--batch-size 32]

Requires TensorFlow (not part of clairfs's test suite, which has no TensorFlow on Debian).
"""
import argparse
import os

import tensorflow as tf


def dataset_for_epoch(mnt, epoch, rank, batch_size, classes):
    order_file = os.path.join(mnt, ".clairfs", "order", "epoch-%d" % epoch, "rank-%d" % rank)
    paths = tf.data.TextLineDataset(order_file)  # one path per line, in clairfs's order
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(tf.constant(classes), tf.range(len(classes), dtype=tf.int64)), -1)

    def load(rel):
        label = table.lookup(tf.strings.split(rel, "/")[0])
        image = tf.io.decode_image(tf.io.read_file(tf.strings.join([mnt, "/", rel])), channels=3,
                                   expand_animations=False)
        return tf.image.resize(image, [224, 224]), label

    # No shuffle: the order file is already the epoch's shuffled order. Keep it deterministic so the
    # reads follow it.
    return (paths.map(load, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
            .batch(batch_size).prefetch(tf.data.AUTOTUNE))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mount")
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    classes = sorted(e.name for e in os.scandir(args.mount) if e.is_dir())
    for epoch in range(args.epochs):
        n = 0
        for images, labels in dataset_for_epoch(args.mount, epoch, args.rank, args.batch_size, classes):
            n += int(labels.shape[0])  # model.train_step(images, labels)
        print("epoch %d: %d samples" % (epoch, n))


if __name__ == "__main__":
    main()
