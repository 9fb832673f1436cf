import copy
import math

import pytest
import pytorch_lightning as pl
import torch
from torch import nn

from lightning_cocod.core import FlatBuffer
from lightning_cocod.data import DigitsDataModule, SyntheticDataModule
from lightning_cocod.models import VGG16, ClassifierModule, ResNet18, SmallCNN, build_model
from lightning_cocod.models.classifier import param_groups
from lightning_cocod.models.schedule import lr_factor
from tests.helpers.trainers import single_cpu_trainer


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Tests share 2 cores with other processes; extra intra-op threads only spin against each other.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def n_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())


def conv(cin, cout, k, bias=False):
    return k * k * cin * cout + (cout if bias else 0)


def bn(c):
    return 2 * c  # weight and bias; running statistics are buffers


def resnet18_by_formula(num_classes):
    total, cin = conv(3, 64, 3) + bn(64), 64
    for cout, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        for s in (stride, 1):
            total += conv(cin, cout, 3) + bn(cout) + conv(cout, cout, 3) + bn(cout)
            if s != 1 or cin != cout:
                total += conv(cin, cout, 1) + bn(cout)
            cin = cout
    return total + 512 * num_classes + num_classes


def vgg16_by_formula(num_classes):
    total, cin = 0, 3
    for v in [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]:
        if v != "M":
            total, cin = total + conv(cin, v, 3, bias=True) + bn(v), v
    return total + 512 * num_classes + num_classes


@pytest.mark.parametrize("num_classes, expected", [(10, 11_173_962), (100, 11_220_132)])
def test_resnet18_parameter_count(num_classes, expected):
    assert resnet18_by_formula(num_classes) == expected
    assert n_params(ResNet18(num_classes)) == expected


@pytest.mark.parametrize("num_classes, expected", [(10, 14_728_266), (100, 14_774_436)])
def test_vgg16_parameter_count(num_classes, expected):
    assert vgg16_by_formula(num_classes) == expected
    assert n_params(VGG16(num_classes)) == expected


def test_state_dict_keys_follow_kuangliu():
    assert {"conv1.weight", "layer1.0.conv1.weight", "layer2.0.shortcut.0.weight", "linear.weight"} <= set(
        ResNet18().state_dict()
    )
    assert {"features.0.weight", "features.1.running_mean", "classifier.weight"} <= set(VGG16().state_dict())


@pytest.mark.parametrize("name", ["resnet18", "vgg16", "small_cnn"])
def test_output_shape_on_cifar_batch(name):
    net = build_model(name, num_classes=7).eval()
    with torch.no_grad():
        assert net(torch.randn(2, 3, 32, 32)).shape == (2, 7)


def test_small_cnn_shapes_and_size():
    assert 100_000 < n_params(SmallCNN(3, 10)) < 200_000
    with torch.no_grad():
        assert SmallCNN(1, 10).eval()(torch.randn(2, 1, 8, 8)).shape == (2, 10)
        assert SmallCNN(3, 100).eval()(torch.randn(2, 3, 32, 32)).shape == (2, 100)


def test_build_model_rejects_unknown_name():
    with pytest.raises(ValueError, match=r"'resnet50'.*resnet18, vgg16, small_cnn"):
        build_model("resnet50", num_classes=10)


def test_lr_factor_hand_values():
    cos = {"schedule": "cosine", "warmup_steps": 4, "total_steps": 12}
    assert lr_factor(0, **cos) == pytest.approx(0.25)
    assert lr_factor(3, **cos) == pytest.approx(1.0)
    assert lr_factor(4, **cos) == pytest.approx(1.0)
    assert lr_factor(8, **cos) == pytest.approx(0.5)  # halfway through the 8 decay steps
    assert lr_factor(6, **cos) == pytest.approx(0.8535534)  # (1 + cos(pi/4)) / 2
    assert lr_factor(12, **cos) == pytest.approx(0.0, abs=1e-12)
    step = {
        "schedule": "step",
        "warmup_steps": 0,
        "total_steps": 30,
        "milestone_steps": [10, 20],
        "gamma": 0.1,
    }
    assert [lr_factor(s, **step) for s in (0, 9, 10, 19, 20, 29)] == pytest.approx(
        [1, 1, 0.1, 0.1, 0.01, 0.01]
    )


def test_no_weight_decay_on_norm_and_bias():
    net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4, 2))
    decay, no_decay = param_groups(net, 5e-4, no_decay_bn_bias=True)
    assert {id(p) for p in decay["params"]} == {id(net[0].weight), id(net[3].weight)}
    assert {id(p) for p in no_decay["params"]} == {
        id(net[0].bias),
        id(net[1].weight),
        id(net[1].bias),
        id(net[3].bias),
    }
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (5e-4, 0.0)
    (single,) = param_groups(net, 5e-4, no_decay_bn_bias=False)
    assert len(single["params"]) == 6 and single["weight_decay"] == 5e-4


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"schedule": "linear"}, r"schedule='linear'.*'cosine', 'step', 'none'"),
        ({"lr": -0.1}, r"lr=-0.1.*positive"),
        ({"milestones": [5, 2]}, r"milestones=\[5.0, 2.0\].*increasing"),
        ({"momentum": 1.5}, r"momentum=1.5"),
    ],
)
def test_classifier_rejects_bad_arguments(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        ClassifierModule(nn.Linear(4, 2), **kwargs)


class RecordLR(pl.Callback):
    def __init__(self):
        self.lrs = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.lrs.append(trainer.optimizers[0].param_groups[0]["lr"])


def tiny_fit(module, datamodule, max_epochs, **trainer_kw):
    recorder = RecordLR()
    trainer = single_cpu_trainer(
        max_epochs=max_epochs, callbacks=[recorder], num_sanity_val_steps=0, limit_val_batches=0, **trainer_kw
    )
    trainer.fit(module, datamodule=datamodule)
    return trainer, recorder.lrs


def tiny_net(num_classes=10):
    return nn.Sequential(nn.Flatten(), nn.Linear(3 * 8 * 8, num_classes))


def synthetic(num_classes=10):
    return SyntheticDataModule(
        num_samples=64, num_eval_samples=16, image_shape=(3, 8, 8), batch_size=8, num_classes=num_classes
    )


def test_warmup_cosine_with_linear_scaling_in_a_fit():
    # 64 samples / batch 8 = 8 steps per epoch; lr 0.1 * 8 / 4 = 0.2 after scaling; 1 warm-up epoch of 3.
    module = ClassifierModule(tiny_net(), lr=0.1, warmup_epochs=1, scale_lr=True, base_batch_size=4)
    _, lrs = tiny_fit(module, synthetic(), max_epochs=3)
    assert len(lrs) == 24
    assert lrs[0] == pytest.approx(0.025)  # 0.2 * 1/8
    assert lrs[3] == pytest.approx(0.1)  # 0.2 * 4/8
    assert lrs[7] == pytest.approx(0.2)
    assert lrs[8] == pytest.approx(0.2)
    assert lrs[16] == pytest.approx(0.1)  # half of the 16 cosine steps
    assert lrs[20] == pytest.approx(0.0292893)  # 0.1 * (1 + cos(3 pi / 4))


def test_step_schedule_in_a_fit():
    module = ClassifierModule(
        tiny_net(),
        lr=0.1,
        schedule="step",
        milestones=[1, 2],
        gamma=0.1,
        global_batch_size=8,
        scale_lr=True,
        base_batch_size=8,
    )
    _, lrs = tiny_fit(module, synthetic(), max_epochs=3)
    assert lrs == pytest.approx([0.1] * 8 + [0.01] * 8 + [0.001] * 8)


def test_the_optimizer_given_gets_the_scaled_scheduled_lr_and_the_decay_groups():
    from functools import partial

    module = ClassifierModule(
        tiny_net(),
        lr=0.1,
        weight_decay=0.01,
        optimizer=partial(torch.optim.AdamW, betas=(0.8, 0.9)),
        schedule="step",
        milestones=[1],
        scale_lr=True,
        base_batch_size=4,
    )
    trainer, lrs = tiny_fit(module, synthetic(), max_epochs=2)
    (optimizer,) = trainer.optimizers
    assert type(optimizer) is torch.optim.AdamW and optimizer.defaults["betas"] == (0.8, 0.9)
    assert [g["weight_decay"] for g in optimizer.param_groups] == [0.01, 0.0]  # none on the bias
    assert lrs == pytest.approx([0.2] * 8 + [0.02] * 8)  # 0.1 x 8 / 4, then x0.1 at epoch 1


def test_top5_logged_for_100_classes():
    module = ClassifierModule(tiny_net(100), lr=0.1)
    trainer = single_cpu_trainer()
    trainer.validate(module, datamodule=synthetic(100), verbose=False)
    assert {"val/loss", "val/acc", "val/acc_top5"} <= set(trainer.callback_metrics)
    assert ClassifierModule(tiny_net(10)).val_acc_top5 is None


def test_small_cnn_learns_digits():
    pl.seed_everything(0)
    module = ClassifierModule(SmallCNN(1, 10, width=32), lr=0.1, warmup_epochs=1)
    trainer = single_cpu_trainer(max_epochs=5)
    datamodule = DigitsDataModule(batch_size=64)
    trainer.fit(module, datamodule=datamodule)
    (result,) = trainer.test(module, datamodule=datamodule, verbose=False)
    assert result["test/acc"] > 0.9
    assert math.isfinite(result["test/loss"])


def test_channels_last_gives_the_same_function_and_nhwc_weights():
    # float64: with a batch of 4, BatchNorm's backward amplifies float32 rounding (which differs
    # between the two layouts' kernels) to 1e-3; in float64 any real difference would still show.
    torch.manual_seed(0)
    net = ResNet18(num_classes=10).double()
    plain = ClassifierModule(copy.deepcopy(net))
    nhwc = ClassifierModule(copy.deepcopy(net), channels_last=True)
    assert nhwc.net.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    assert not plain.net.conv1.weight.is_contiguous(memory_format=torch.channels_last)
    x, y = torch.randn(4, 3, 32, 32, dtype=torch.float64), torch.tensor([0, 3, 5, 9])
    losses = []
    for module in (plain, nhwc):
        module.train()
        loss = nn.functional.cross_entropy(module(x), y)
        loss.backward()
        losses.append(loss.detach())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-12, atol=1e-12)
    for (name, p), q in zip(plain.net.named_parameters(), nhwc.net.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-9, atol=1e-12, msg=name)
    # Running statistics saw the same batch in either layout.
    torch.testing.assert_close(nhwc.net.bn1.running_mean, plain.net.bn1.running_mean)


def test_flat_buffers_round_trip_channels_last_parameters_exactly():
    module = ClassifierModule(ResNet18(num_classes=10), channels_last=True)
    tensors = [p.detach() for p in module.parameters()]
    assert any(t.dim() == 4 and not t.is_contiguous() for t in tensors)  # NHWC strides, not NCHW
    original = [t.clone() for t in tensors]
    flat = FlatBuffer(tensors)
    flat.pack(tensors)
    assert all(torch.equal(view, t) for view, t in zip(flat.views, original))
    offset = 0
    for t in original:  # the bucket holds each tensor in logical (NCHW) order
        assert torch.equal(flat.buckets[0][offset : offset + t.numel()], t.reshape(-1))
        offset += t.numel()
    with torch.no_grad():
        for t in tensors:
            t.zero_()
    flat.unpack(tensors)
    assert all(torch.equal(t, o) for t, o in zip(tensors, original))
    assert module.net.conv1.weight.is_contiguous(memory_format=torch.channels_last)  # storage kept


def test_bf16_mixed_and_channels_last_train_a_conv_net():
    pl.seed_everything(0)
    net = nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 10)
    )
    module = ClassifierModule(net, lr=0.05, schedule="none", channels_last=True)
    before = [p.detach().clone() for p in module.parameters()]
    trainer = single_cpu_trainer(
        max_steps=4, precision="bf16-mixed", num_sanity_val_steps=0, limit_val_batches=0
    )
    trainer.fit(module, datamodule=synthetic())
    after = list(module.parameters())
    # The master weights stay float32 under autocast.
    assert all(p.dtype == torch.float32 and torch.isfinite(p).all() for p in after)
    assert all(not torch.equal(b, a) for b, a in zip(before, after))
    assert math.isfinite(float(trainer.callback_metrics["train/loss"]))
    assert module.net[0].weight.is_contiguous(memory_format=torch.channels_last)


def test_channels_last_must_be_a_bool():
    with pytest.raises(ValueError, match=r"channels_last='yes' is invalid; accepted: True or False"):
        ClassifierModule(nn.Linear(4, 2), channels_last="yes")
