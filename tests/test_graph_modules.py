"""The graph by module: real models' training steps (torchvision resnet18, a GPT-2 built from a
small config) traced with module scopes, their hash and compiles unchanged, their view
grouped by phase and module with FLOPs per box."""

import xml.etree.ElementTree as ET

import pytest
import torch
import torch_xla
import torch_xla.debug.metrics as met

import tpu_nb
from tpu_nb.display.graph_view import HEAVIEST, GraphView
from tpu_nb.runtime.graph import graph, hlo_flops, record_locations

SVG = "{http://www.w3.org/2000/svg}"


def _resnet():
    import torchvision

    torch.manual_seed(0)
    dev = tpu_nb.device()
    model = torchvision.models.resnet18(num_classes=10).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # no state: every step the same graph
    x, y = torch.randn(2, 3, 32, 32).to(dev), torch.tensor([1, 2]).to(dev)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        return model, opt

    return step


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    dev = tpu_nb.device()
    config = GPT2Config(n_layer=3, n_embd=32, n_head=2, vocab_size=128, n_positions=16)
    model = GPT2LMHeadModel(config).to(dev)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 128, (2, 8)).to(dev)

    def step():
        opt.zero_grad()
        model(ids, labels=ids).loss.backward()
        opt.step()
        return model, opt

    return step


def _compiles() -> int:
    return met.counter_value("UncachedCompile") or 0


@pytest.fixture(scope="module", params=["resnet18", "gpt2"])
def traced(request):
    """The same training step without and with module scopes: (plain hash, compiles the
    plain step made, the scoped Graph, compiles the scoped step made)."""
    step = {"resnet18": _resnet, "gpt2": _gpt2}[request.param]()
    step()  # the first step traces a few scalars as constants, later steps as device data
    torch_xla.sync()
    before = _compiles()
    plain = graph(*step(), hlo=False).hash
    torch_xla.sync()
    plain_compiles = _compiles() - before
    hooks = dict(torch.nn.modules.module._global_forward_hooks)
    with record_locations():
        scoped = graph(*step())
    assert dict(torch.nn.modules.module._global_forward_hooks) == hooks  # switched off
    before = _compiles()
    torch_xla.sync()
    return request.param, plain, plain_compiles, scoped, _compiles() - before


def test_module_scopes_change_neither_the_graph_hash_nor_the_compiles(traced):
    _, plain, plain_compiles, scoped, scoped_compiles = traced
    assert scoped.hash == plain
    assert plain_compiles in (0, 1) and scoped_compiles == 0  # the same graph, found compiled


def test_the_default_view_names_the_models_modules_by_phase(traced):
    name, _, _, g, _ = traced
    keys = {gr.key for gr in g.groups().groups}
    if name == "resnet18":
        expected = {"forward:ResNet.layer1.0", "forward:ResNet.fc", "backward:ResNet.fc"}
        expected |= {"backward:ResNet.layer4.1", "optimizer:SGD"}
    else:
        model = "GPT2LMHeadModel"
        expected = {f"forward:{model}.transformer.h.0-2", f"backward:{model}.transformer.h.0-2"}
        expected |= {f"forward:{model}.lm_head", f"backward:{model}.lm_head", "optimizer:SGD"}
    assert expected <= keys, sorted(keys)
    assert not any(k.startswith("%") and "-%" in k for k in keys)  # no id ranges


def test_a_row_of_repeated_blocks_expands_into_the_blocks_and_nodes_say_their_module(traced):
    name, _, _, g, _ = traced
    if name != "gpt2":
        pytest.skip("resnet18's Sequentials hold two blocks: shown one by one already")
    view = GraphView(g, expand=["transformer.h.0-2"])
    keys = {gr.key for gr in view.grouped().groups}
    blocks = {f"forward:GPT2LMHeadModel.transformer.h.{i}" for i in range(3)}
    assert blocks <= keys and "forward:GPT2LMHeadModel.transformer.h.0-2" not in keys
    opened = GraphView(g, expand=["transformer.h.0-2", "transformer.h.1.mlp.c_fc"])
    tips = [t.text for t in ET.fromstring(opened.to_svg()).iter(f"{SVG}title")]
    addmm = [t for t in tips if "aten::addmm" in t and "module " in t]
    assert addmm and "module GPT2LMHeadModel.transformer.h.1.mlp.c_fc (forward)" in addmm[0]
    assert "shape f32[" in addmm[0] and "line " in addmm[0]


def test_module_boxes_add_up_to_the_graphs_flops_and_the_heaviest_stands_out(traced):
    name, _, _, g, _ = traced
    grouped = g.groups()
    total = sum(gr.flops for gr in grouped.groups)
    counted = hlo_flops(g.hlo()).flops
    if name == "gpt2":
        assert total == counted
    else:  # the first convolution's input gradient: computed in the IR, dead in the HLO
        assert counted < total < counted * 1.05
    top = max(gr.flops for gr in grouped.groups)
    heaviest = {gr.label for gr in grouped.groups if gr.flops == top}  # ties: all of them
    svg = ET.fromstring(GraphView(g).to_svg())
    red = [
        next(box.iter(f"{SVG}text")).text
        for box in svg.iter(f"{SVG}g")
        if any(r.get("stroke") == HEAVIEST for r in box.iter(f"{SVG}rect"))
    ]
    assert red and set(red) == heaviest and len(red) < len(grouped.groups) // 4
    # a step's backward holds twice the forward's matmuls
    assert all(gr.phase == "backward" for gr in grouped.groups if gr.flops == top)


def test_the_model_explorer_export_nests_nodes_by_phase_and_module_with_their_cost(
    traced, tmp_path
):
    import json

    name, _, _, g, _ = traced
    if name != "gpt2":
        pytest.skip("one model is enough for the file format")
    collection = g.to_model_explorer("train step")
    (tmp_path / "step.json").write_text(json.dumps(collection))  # what a user saves
    assert set(collection) == {"label", "graphs"} and collection["label"] == "train step"
    (one,) = collection["graphs"]
    nodes = one["nodes"]
    assert set(one) == {"id", "nodes"} and len(nodes) == len(g.nodes)
    ids = {n["id"] for n in nodes}
    assert len(ids) == len(nodes)
    keys = {"id", "label", "namespace", "attrs", "incomingEdges", "outputsMetadata"}
    for n in nodes:  # Model Explorer's GraphNode fields, strings where it wants strings
        assert set(n) == keys and all(isinstance(n[k], str) for k in ("id", "label"))
        assert all(set(a) == {"key", "value"} and isinstance(a["value"], str) for a in n["attrs"])
        for e in n["incomingEdges"]:
            assert e["sourceNodeId"] in ids
            assert e["sourceNodeOutputId"].isdigit() and e["targetNodeInputId"].isdigit()
    c_fc = [n for n in nodes if n["namespace"].endswith("/h/1/mlp/c_fc") and n["label"] == "addmm"]
    assert c_fc and c_fc[0]["namespace"] == "forward/GPT2LMHeadModel/transformer/h/1/mlp/c_fc"
    data = g.model_explorer_data("flops")[one["id"]]
    assert set(data["results"]) == ids
    flops = sum(r["value"] for r in data["results"].values())
    assert flops == hlo_flops(g.hlo()).flops
    attrs = dict((a["key"], a["value"]) for a in c_fc[0]["attrs"])
    assert int(attrs["flops"]) == data["results"][c_fc[0]["id"]]["value"] > 0
    assert attrs["module"] == "GPT2LMHeadModel.transformer.h.1.mlp.c_fc"
