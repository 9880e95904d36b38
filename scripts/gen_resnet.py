#!/usr/bin/env python3
"""Writes the ResNet configs of p2ptrain (Caffe's layer names and semantics).

    python3 scripts/gen_resnet.py resnet20 > config/resnet20.toml
    python3 scripts/gen_resnet.py resnet20_fashion > config/resnet20_fashion.toml
    python3 scripts/gen_resnet.py resnet50 > config/resnet50.toml
    python3 scripts/gen_resnet.py resnet50_imagenet > config/resnet50_imagenet.toml

resnet20: the CIFAR ResNet of He et al. (2016, sec. 4.2): a 3x3 convolution with 16 channels, three
stages of three basic blocks (two 3x3 convolutions) with 16/32/64 channels, global average pooling,
inner product 10. Where the shape changes (first block of stages 2 and 3) the shortcut is a 1x1
convolution with stride 2 plus BatchNorm/Scale (projection); elsewhere the identity.

resnet20_fashion: the same net on Fashion-MNIST (1x28x28 grey images, IDX files as in
config/fashion_mnist.toml), a schedule of 12,000 iterations (about 26 epochs) with a cosine rate:
the mixed-precision accuracy runs of scripts/gpu/accuracy.sh.

resnet50: the ImageNet ResNet-50 v1 of Kaiming He's Caffe release (ResNet-50-deploy.prototxt):
7x7/2 convolution, 3x3/2 max pooling, bottleneck stages of 3, 4, 6, 3 blocks (1x1, 3x3, 1x1 with
64/128/256/512 channels, 4x wider output), the stride on the first 1x1 convolution of a stage
(branch2a) and on the projection shortcut (branch1), global average pooling, inner product 1000.

Every convolution has no bias and is followed by batch_norm (sync = true) and scale (with bias),
as in Caffe. Only the standard library is used.
"""

import sys


class Net:
    def __init__(self, sync):
        self.out = []
        self.sync = sync

    def layer(self, **kv):
        lines = ["[[layer]]"]
        for k, v in kv.items():
            lines.append(f"{k} = {fmt(v)}")
        self.out.append("\n".join(lines))

    def conv_bn(self, name, bn, scale, bottom, top, num_output, k, stride=1, pad=0):
        kv = dict(name=name, type="convolution", bottom=[bottom], top=[top],
                  num_output=num_output, kernel_size=k)
        if stride != 1:
            kv["stride"] = stride
        if pad:
            kv["pad"] = pad
        kv.update(bias_term=False, weight_filler=Raw('{ type = "msra" }'))
        self.layer(**kv)
        bn_kv = dict(name=bn, type="batch_norm", bottom=[top], top=[top])
        if self.sync:
            bn_kv["sync"] = True
        self.layer(**bn_kv)
        self.layer(name=scale, type="scale", bottom=[top], top=[top], bias_term=True)

    def relu(self, name, blob):
        self.layer(name=name, type="relu", bottom=[blob], top=[blob])

    def text(self):
        return "\n\n".join(self.out) + "\n"


class Raw(str):
    """A TOML value written as given."""


def fmt(v):
    if isinstance(v, Raw):
        return str(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return f'"{v}"'
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v) + "]"
    raise TypeError(v)


def head(net, scores, top5=False):
    net.layer(name="loss", type="softmax_with_loss", bottom=[scores, "label"], top=["loss"])
    net.layer(name="accuracy", type="accuracy", bottom=[scores, "label"], top=["accuracy"],
              phase="test")
    if top5:
        net.layer(name="accuracy_top5", type="accuracy", bottom=[scores, "label"],
                  top=["accuracy_top5"], top_k=5, phase="test")


def resnet20(header=None):
    net = Net(sync=True)
    net.conv_bn("conv1", "bn_conv1", "scale_conv1", "data", "conv1", 16, 3, pad=1)
    net.relu("conv1_relu", "conv1")
    bottom = "conv1"
    for s, width in enumerate([16, 32, 64]):
        for b in range(3):
            name = f"res{s + 2}{chr(ord('a') + b)}"
            stride = 2 if s > 0 and b == 0 else 1
            if stride != 1:
                net.conv_bn(f"{name}_branch1", f"bn{name[3:]}_branch1", f"scale{name[3:]}_branch1",
                            bottom, f"{name}_branch1", width, 1, stride=stride)
                shortcut = f"{name}_branch1"
            else:
                shortcut = bottom
            tag = name[3:]
            net.conv_bn(f"{name}_branch2a", f"bn{tag}_branch2a", f"scale{tag}_branch2a", bottom,
                        f"{name}_branch2a", width, 3, stride=stride, pad=1)
            net.relu(f"{name}_branch2a_relu", f"{name}_branch2a")
            net.conv_bn(f"{name}_branch2b", f"bn{tag}_branch2b", f"scale{tag}_branch2b",
                        f"{name}_branch2a", f"{name}_branch2b", width, 3, pad=1)
            net.layer(name=name, type="eltwise", bottom=[shortcut, f"{name}_branch2b"], top=[name])
            net.relu(f"{name}_relu", name)
            bottom = name
    net.layer(name="pool5", type="pooling", bottom=[bottom], top=["pool5"], pool="ave",
              global_pooling=True)
    net.layer(name="fc10", type="inner_product", bottom=["pool5"], top=["fc10"], num_output=10,
              weight_filler=Raw('{ type = "msra" }'))
    head(net, "fc10")
    return (header or RESNET20_HEADER) + net.text()


def resnet20_fashion():
    return resnet20(RESNET20_FASHION_HEADER)


def resnet50(header=None, top5=False):
    net = Net(sync=True)
    net.conv_bn("conv1", "bn_conv1", "scale_conv1", "data", "conv1", 64, 7, stride=2, pad=3)
    net.relu("conv1_relu", "conv1")
    net.layer(name="pool1", type="pooling", bottom=["conv1"], top=["pool1"], pool="max",
              kernel_size=3, stride=2)
    bottom = "pool1"
    for s, (blocks, width) in enumerate(zip([3, 4, 6, 3], [64, 128, 256, 512])):
        for b in range(blocks):
            tag = f"{s + 2}{chr(ord('a') + b)}"
            name = f"res{tag}"
            stride = 2 if s > 0 and b == 0 else 1
            if b == 0:
                net.conv_bn(f"{name}_branch1", f"bn{tag}_branch1", f"scale{tag}_branch1", bottom,
                            f"{name}_branch1", 4 * width, 1, stride=stride)
                shortcut = f"{name}_branch1"
            else:
                shortcut = bottom
            net.conv_bn(f"{name}_branch2a", f"bn{tag}_branch2a", f"scale{tag}_branch2a", bottom,
                        f"{name}_branch2a", width, 1, stride=stride)
            net.relu(f"{name}_branch2a_relu", f"{name}_branch2a")
            net.conv_bn(f"{name}_branch2b", f"bn{tag}_branch2b", f"scale{tag}_branch2b",
                        f"{name}_branch2a", f"{name}_branch2b", width, 3, pad=1)
            net.relu(f"{name}_branch2b_relu", f"{name}_branch2b")
            net.conv_bn(f"{name}_branch2c", f"bn{tag}_branch2c", f"scale{tag}_branch2c",
                        f"{name}_branch2b", f"{name}_branch2c", 4 * width, 1)
            net.layer(name=name, type="eltwise", bottom=[shortcut, f"{name}_branch2c"], top=[name])
            net.relu(f"{name}_relu", name)
            bottom = name
    net.layer(name="pool5", type="pooling", bottom=[bottom], top=["pool5"], pool="ave",
              global_pooling=True)
    net.layer(name="fc1000", type="inner_product", bottom=["pool5"], top=["fc1000"],
              num_output=1000, weight_filler=Raw('{ type = "msra" }'))
    head(net, "fc1000", top5)
    return (header or RESNET50_HEADER) + net.text()


def resnet50_imagenet():
    return resnet50(RESNET50_IMAGENET_HEADER, top5=True)


# The tables every config here shares: where it runs, and the papers' SGD (before its schedule).
CLUSTER = """\
[cluster]
backend = "auto"
replicas_per_rank = 1
"""

SGD = """\
[solver]
type = "sgd"
base_lr = 0.1
momentum = 0.9
weight_decay = 1e-4
"""

RESNET20_HEADER = """\
# ResNet-20 for CIFAR-10 (He et al., "Deep Residual Learning for Image Recognition", sec. 4.2):
# 3 stages x 3 basic blocks, 16/32/64 channels, conv-BatchNorm-Scale-ReLU, projection shortcuts
# (1x1 convolution, stride 2, + BatchNorm/Scale) where the shape changes, global average pooling,
# inner product 10. SGD lr 0.1, momentum 0.9, weight decay 1e-4, x0.1 at 32k and 48k, 64k iterations,
# batch 128 (global: batch_size is per replica, so 128 = e.g. 2 replicas x 64 -- set batch_size to
# 128 / replicas). BatchNorm has sync = true: statistics over the global batch of every replica.
#
# Generated by `python3 scripts/gen_resnet.py resnet20 > config/resnet20.toml`; edit the script,
# not this file.
#
# Data: the CIFAR-10 binary batches (https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz,
# extracted so that data/cifar10/ holds data_batch_1.bin ... data_batch_5.bin and test_batch.bin;
# paths are relative to this file). Augmentation as in the paper: random translations of up to 4
# pixels (`shift`, the uncovered border filled as a black pixel) and horizontal flips, keyed by
# sample position so that every topology sees the same images; per-channel means of the training
# set (RGB, pixel units) subtracted and the result scaled to about unit spread.

""" + CLUSTER + """
[data]
format = "cifar10"
train_files = [
  "../data/cifar10/data_batch_1.bin",
  "../data/cifar10/data_batch_2.bin",
  "../data/cifar10/data_batch_3.bin",
  "../data/cifar10/data_batch_4.bin",
  "../data/cifar10/data_batch_5.bin",
]
test_files = ["../data/cifar10/test_batch.bin"]
mean_value = [125.3, 123.0, 113.9]
scale = 0.0157
shift = 4
mirror = true
batch_size = 128
shuffle = true

""" + SGD + """lr_policy = "multistep"
gamma = 0.1
stepvalue = [32000, 48000]
max_iter = 64000
display = 100
test_interval = 2000
snapshot = 10000
snapshot_prefix = "snapshots/resnet20"
random_seed = 1

"""

RESNET20_FASHION_HEADER = """\
# ResNet-20 (as config/resnet20.toml: 3 stages x 3 basic blocks, 16/32/64 channels,
# conv-BatchNorm-Scale-ReLU, projection shortcuts where the shape changes, global average pooling,
# inner product 10, BatchNorm sync = true) adapted to Fashion-MNIST: 60,000 training and 10,000
# test images of clothing, 1x28x28 grey, 10 classes. The accuracy evidence for mixed precision
# (scripts/gpu/accuracy.sh trains it in fp32, bf16 and fp16 with 3 seeds each).
#
# Generated by `python3 scripts/gen_resnet.py resnet20_fashion > config/resnet20_fashion.toml`;
# edit the script, not this file.
#
# Adapted from the CIFAR-10 config: the data (Debian's IDX files, `apt-get install
# dataset-fashion-mnist`, as config/fashion_mnist.toml reads them); the input has 1 channel and
# 28x28 pixels, so the stages see 28x28, 14x14 and 7x7 maps (the net is otherwise unchanged).
# Augmentation for small grey images: random translations of up to 2 pixels (`shift`, the border
# filled as a black pixel) and horizontal flips, keyed by sample position; the training set's
# mean (72.94) subtracted and the result scaled by 1 / 90.0 (its standard deviation). The schedule
# is shortened: batch 128 (global; set batch_size to 128 / replicas), SGD lr 0.1, momentum 0.9,
# weight decay 1e-4, a cosine rate over 12,000 iterations (25.6 epochs of 469 iterations), a test
# on the 10,000 test images (test_iter 100 x 100 per replica: divide test_iter by the replicas too)
# every 2,000 iterations and at the end, one snapshot at the end.

""" + CLUSTER + """
[data]
format = "idx"
train_images = "/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"
train_labels = "/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz"
test_images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz"
test_labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
mean_value = [72.94]
scale = 0.0111
shift = 2
mirror = true
batch_size = 128
test_batch_size = 100
shuffle = true

""" + SGD + """lr_policy = "cosine"
max_iter = 12000
display = 500
test_interval = 2000
test_iter = 100
snapshot = 0
snapshot_prefix = "snapshots/resnet20_fashion"
random_seed = 1

"""

RESNET50_HEADER = """\
# ResNet-50 v1 for ImageNet (Kaiming He's Caffe model, ResNet-50-deploy.prototxt): 7x7/2
# convolution, 3x3/2 max pooling, bottleneck stages of 3/4/6/3 blocks (64/128/256/512 channels,
# 4x wider outputs; stride on branch2a and on the projection branch1), conv-BatchNorm-Scale-ReLU,
# global average pooling, inner product 1000. For benchmarks: synthetic 3x224x224 records in 1000
# classes, batch 64 per replica, SGD lr 0.1 momentum 0.9 weight decay 1e-4 (test_size is small:
# the test pass at the end only shows that the net evaluates). BatchNorm has sync = true.
#
# Generated by `python3 scripts/gen_resnet.py resnet50 > config/resnet50.toml`; edit the script,
# not this file.

""" + CLUSTER + """
[data]
format = "synthetic"
shape = [3, 224, 224]
classes = 1000
train_size = 1281167
test_size = 1024
batch_size = 64
shuffle = true
prefetch = 4

""" + SGD + """lr_policy = "fixed"
max_iter = 100
display = 10
test_interval = 0
snapshot = 0
snapshot_prefix = "snapshots/resnet50"
random_seed = 1

"""


RESNET50_IMAGENET_HEADER = """\
# ResNet-50 v1 (as config/resnet50.toml) trained on ImageNet from its JPEGs, in torchvision's
# ImageFolder layout: data/imagenet/train/<class>/*.JPEG and data/imagenet/val/<class>/*.JPEG
# (paths relative to this file; the 1000 class folders sorted by name give the labels).
#
# Recipe (Goyal et al. 2017, torchvision's reference): SGD momentum 0.9, weight decay 1e-4,
# lr 0.1 x global batch / 256, divided by 10 at epochs 30, 60 and 80 of 90. Written for a global
# batch of 256 (batch_size 64 x 4 replicas; with 8 replicas set batch_size = 32): one epoch =
# 1,281,167 / 256 = 5005 iterations. For another global batch G, multiply base_lr by G / 256
# and every iteration count by 256 / G.
#
# Data: random_resized_crop 224 (area 0.08-1, aspect 3/4-4/3) with flips in training, the shorter
# side resized to 256 and the centre 224 square in tests; keyed by (seed, position), so any
# topology sees the same images. Pixels are B, G, R (Caffe's order): ImageNet's means in that
# order, scaled by 1 / 57.4 (about its standard deviation). Top-1 and top-5 accuracy.
#
# Generated by `python3 scripts/gen_resnet.py resnet50_imagenet > config/resnet50_imagenet.toml`;
# edit the script, not this file.

""" + CLUSTER + """math = "tf32"

[data]
format = "image_folder"
train_source = "../data/imagenet/train"
test_source = "../data/imagenet/val"
classes = 1000
random_resized_crop = 224
resize_shorter = 256
mirror = true
mean_value = [103.53, 116.28, 123.675]
scale = 0.0174
batch_size = 64
test_batch_size = 50
shuffle = true
prefetch = 4

""" + SGD + """lr_policy = "multistep"
gamma = 0.1
stepvalue = [150150, 300300, 400400]
max_iter = 450450
display = 100
test_interval = 5005
snapshot = 5005
snapshot_keep = 3
snapshot_prefix = "snapshots/resnet50_imagenet"
random_seed = 1

"""


def main():
    gens = {"resnet20": resnet20, "resnet20_fashion": resnet20_fashion, "resnet50": resnet50,
            "resnet50_imagenet": resnet50_imagenet}
    if len(sys.argv) != 2 or sys.argv[1] not in gens:
        sys.exit(f"usage: {sys.argv[0]} {{{'|'.join(gens)}}}")
    sys.stdout.write(gens[sys.argv[1]]())


if __name__ == "__main__":
    main()
