"""The lazy graph as data: real XLA:CPU graphs parsed right, source lines, diffs, errors."""

import inspect
import json
import re

import pytest
import torch
import torch_xla

import tpu_nb
from tpu_nb.runtime.errors import TpuNbError
from tpu_nb.runtime.graph import Graph, graph, is_pending, pending_graph, record_locations

X = torch_xla._XLAC
_NODE_LINE = re.compile(r"^\s*%\d+ = ", re.M)
_OPERAND = re.compile(r"%\d+(?:\.\d+)?")


def _mlp_step(batch=8, width=6, optimizer="sgd"):
    """A pending MLP training step: (loss, model, optimizer), nothing synced after it."""
    dev = tpu_nb.device()
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3)
    ).to(dev)
    opt = (
        torch.optim.SGD(model.parameters(), lr=0.1)
        if optimizer == "sgd"
        else torch.optim.AdamW(model.parameters())
    )
    x = torch.randn(batch, width).to(dev)
    y = torch.randint(0, 3, (batch,)).to(dev)
    torch_xla.sync()
    loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    return loss, model, opt


def _operand_count(text):
    count = 0
    for line in text.splitlines():
        if _NODE_LINE.match(line):
            head = line.split(" = ", 1)[1]
            args = head[head.index("(") + 1 : head.index(")", head.index("("))]
            count += len(_OPERAND.findall(args))
    return count


def test_node_and_edge_counts_match_torch_xla_text_and_dot():
    loss, model, opt = _mlp_step(optimizer="adamw")
    g = graph(loss, model, opt)
    tensors = (
        [loss]
        + list(model.parameters())
        + [
            s
            for st in opt.state.values()
            for s in st.values()
            if torch.is_tensor(s) and s.device.type == "xla"
        ]
    )
    text = X._get_xla_tensors_text(tensors)
    dot = X._get_xla_tensors_dot(tensors)
    dot_nodes = re.findall(r"^\s*node\d+ \[label=", dot, re.M)
    assert len(g.nodes) == len(_NODE_LINE.findall(text)) == len(dot_nodes)
    assert len(g.edges) == _operand_count(text) == dot.count(" -> ")
    assert len(g.roots) == text.count("ROOT=") == len(tensors)
    assert g.nodes[g.roots[0]].op == "aten::nll_loss"  # the loss is output 0
    assert g.hash == g.hash.lower() and len(g.hash) >= 16
    assert g.pending and g.kinds()["data"] > 0 and "compute" in g.kinds()


def test_parsed_nodes_carry_shape_dtype_and_output_index_of_multi_output_ops():
    dev = tpu_nb.device()
    a = torch.randn(5, 7, device=dev)
    torch_xla.sync()
    values, indices = torch.max(a * 2, dim=1)
    out = values + indices.float()
    g = graph(out)
    max_node = next(n for n in g.nodes if n.op == "aten::max")
    assert max_node.num_outputs == 2 and max_node.shape == "(f32[5], s64[5])"
    assert max_node.kind == "reduction"
    reads = {e.output: e.shape for e in g.edges if e.src == max_node.id}
    assert reads == {0: "f32[5]", 1: "s64[5]"}
    root = g.node(g.roots[0])
    assert (root.op, root.shape, root.dtype, root.layout) == ("aten::add", "f32[5]", "f32", "{0}")


def test_graph_accepts_modules_optimizers_and_containers_and_skips_cpu_state():
    loss, model, opt = _mlp_step(optimizer="adamw")
    g = graph({"loss": loss, "parts": [model, opt]})
    # AdamW keeps its step counters on the CPU: skipped, not an error, inside containers
    assert len(g.roots) == 1 + 4 + 2 * 4


def test_graph_refuses_what_has_no_lazy_graph_with_a_fix():
    with pytest.raises(TpuNbError, match="not lazy.*Fix"):
        graph(torch.ones(3))
    with pytest.raises(TpuNbError, match="got int.*Fix"):
        graph(3)
    with pytest.raises(TpuNbError, match="no XLA tensor.*Fix"):
        graph([])
    with pytest.raises(TpuNbError, match="no HLO.*Fix"):
        Graph.from_ir_text("IR {\n}\n").hlo()
    with pytest.raises(TpuNbError, match="not torch_xla IR.*Fix"):
        Graph.from_ir_text("hello")


def test_hlo_and_ir_text_are_kept_and_json_round_trips():
    loss, model, _ = _mlp_step()
    g = graph(loss, model)
    assert g.hlo().startswith("HloModule") and "ENTRY" in g.hlo()
    assert g.ir_text().startswith("IR {")
    assert Graph.from_json(g.to_json()) == g
    data = json.loads(g.to_json())
    assert data["nodes"][0].keys() >= {"id", "op", "kind", "shape", "dtype", "location"}
    assert graph(loss, hlo=False).hlo_text is None


def test_after_the_sync_only_device_data_is_left():
    loss, model, _ = _mlp_step()
    torch_xla.sync()
    g = graph(loss)
    assert not g.pending and [n.op for n in g.nodes] == ["xla::device_data"]


def test_record_locations_points_nodes_at_the_lines_that_made_them():
    dev = tpu_nb.device()
    a = torch.randn(4, 4, device=dev)
    torch_xla.sync()
    here = inspect.currentframe().f_lineno
    with record_locations():
        b = a * 3  # here + 2
        c = torch.tanh(b)  # here + 3
    d = c + 1  # outside: no location
    g = graph(d)
    by_op = {n.op: n for n in g.nodes}
    assert by_op["aten::mul"].location.line == here + 2
    assert by_op["aten::tanh"].location.line == here + 3
    assert by_op["aten::tanh"].location.file == "test_graph.py"
    assert by_op["aten::tanh"].location.function == inspect.currentframe().f_code.co_name
    assert by_op["aten::add"].location is None
    assert not X._get_ir_debug()  # restored on exit


SCRIPT = """\
import json
import torch, torch_xla
from tpu_nb.runtime.graph import graph
dev = torch_xla.device()
a = torch.ones(4, 4, device=dev)
b = a * 3
c = torch.relu(b) + 1
def helper(t):
    return t.sum(dim=0)
d = helper(c)
model = torch.nn.Linear(4, 2).to(dev)
e = model(d.unsqueeze(0))
g = graph(e)
print(json.dumps([[n.op, [n.location.file, n.location.line, n.location.function]
                   if n.location else None,
                   [n.user_frame.file, n.user_frame.line] if n.user_frame else None]
                  for n in g.nodes]))
"""


def test_xla_ir_debug_source_lines_point_at_the_script_lines(py, tmp_path):
    script = tmp_path / "lines_script.py"
    script.write_text(SCRIPT)
    out = py(
        f"import runpy; runpy.run_path({str(script)!r}, run_name='__main__')",
        env={"XLA_IR_DEBUG": "1"},
    ).stdout
    rows = json.loads(out.strip().splitlines()[-1])
    located = {op: loc for op, loc, _ in rows}
    assert located["aten::mul"] == ["lines_script.py", 6, "<module>"]
    assert located["aten::relu"] == ["lines_script.py", 7, "<module>"]
    assert located["aten::sum"] == ["lines_script.py", 9, "helper"]
    # a module call points into torch's own code: the innermost Python frame ...
    assert located["aten::addmm"][0] == "linear.py"
    assert located["aten::addmm"][2] == "forward"
    # ... and the whole stack (from the HLO) names the script line that called the module
    user = {op: frame for op, _, frame in rows}
    assert user["aten::addmm"] == [str(script), 12]
    assert user["aten::sum"] == [str(script), 9]


def _forward(batch, width=5):
    dev = tpu_nb.device()
    torch.manual_seed(0)
    layer = torch.nn.Linear(width, 7).to(dev)
    x = torch.randn(batch, width).to(dev)
    torch_xla.sync()
    with record_locations():
        return graph(torch.relu(layer(x)).sum(dim=1))


def test_diff_of_a_shape_change_names_the_changed_nodes_and_where_it_starts():
    before, after = _forward(batch=8), _forward(batch=6)
    assert before.hash != after.hash
    d = after.diff(before)
    assert d.aligned and not d.added and not d.removed
    changed = {c.after.op: (c.before.shape, c.after.shape) for c in d.changed}
    assert changed["aten::addmm"] == ("f32[8,7]", "f32[6,7]")
    assert changed["aten::relu"] == ("f32[8,7]", "f32[6,7]")
    assert changed["aten::sum"] == ("f32[8]", "f32[6]")
    assert [(c.after.op, c.after.shape) for c in d.causes] == [("xla::device_data", "f32[6,5]")]
    text = str(d)
    assert "where it starts" in text and "f32[8,5] -> f32[6,5]" in text
    assert "aten::addmm" in text and "linear.py:134" in text
    assert d.changed_ids == {c.after.id for c in d.changed}


def test_diff_of_the_same_graph_is_empty_and_of_an_extra_op_names_it():
    g1, g2 = _forward(batch=4), _forward(batch=4)
    same = g2.diff(g1)
    assert not same and same.summary().startswith("no difference")
    dev = tpu_nb.device()
    layer = torch.nn.Linear(5, 7).to(dev)
    x = torch.randn(4, 5).to(dev)
    torch_xla.sync()
    with record_locations():
        extra = graph(torch.sigmoid(torch.relu(layer(x))).sum(dim=1))
    d = extra.diff(g1)
    assert [c.after.op for c in d.added] == ["aten::sigmoid"]
    assert "added" in str(d) and "aten::sigmoid" in str(d)


def test_fallback_ops_are_recorded_and_host_reads_are_not():
    dev = tpu_nb.device()
    a = torch.tensor([3.0, 1.0, 3.0, 2.0], device=dev)
    torch_xla.sync()
    u = torch.unique(a)  # no XLA lowering: runs on the CPU
    a.sum().item()  # a device->host read, not a fallback
    g = graph(u * 2)
    names = dict(g.fallback_ops)
    assert names.get("aten::_unique2", 0) >= 1
    assert "aten::_local_scalar_dense" not in names


def test_pending_graph_finds_what_a_cell_left_pending_in_its_namespace():
    dev = tpu_nb.device()
    model = torch.nn.Linear(3, 2).to(dev)
    x = torch.randn(4, 3).to(dev)
    torch_xla.sync()
    namespace = {"model": model, "x": x, "n": 3, "outs": [model(x).relu()], "torch": torch}
    namespace["again"] = namespace  # cycles are fine
    assert not is_pending(x) and is_pending(namespace["outs"][0])
    g = pending_graph(namespace)
    assert [g.node(r).op for r in g.roots] == ["aten::relu"]  # not the synced params
    torch_xla.sync()
    assert pending_graph(namespace) is None


def test_pending_graph_without_arguments_finds_live_tensors_only_a_function_holds():
    dev = tpu_nb.device()
    x = torch.randn(4, 3).to(dev)
    torch_xla.sync()
    seen = {}

    def step():
        hidden = torch.tanh(x * 2)  # held only by this frame
        seen["graph"] = pending_graph()
        return hidden.sum().item()

    step()
    ops = {n.op for n in seen["graph"].nodes}
    assert {"aten::tanh", "aten::mul"} <= ops


def test_nodes_made_inside_a_module_know_the_user_line_that_called_it():
    dev = tpu_nb.device()
    torch.manual_seed(0)
    first, second = torch.nn.Linear(4, 4).to(dev), torch.nn.Linear(4, 2).to(dev)
    x = torch.randn(3, 4).to(dev)
    torch_xla.sync()
    here = inspect.currentframe().f_lineno
    with record_locations():
        h = first(x)  # here + 2
        out = second(torch.relu(h))  # here + 3
    g = graph(out)
    addmm = [n for n in g.nodes if n.op == "aten::addmm"]
    assert [n.location.file for n in addmm] == ["linear.py", "linear.py"]
    assert [n.user_frame.line for n in addmm] == [here + 2, here + 3]
    assert all(n.user_frame.file == __file__ for n in addmm)
    assert len(addmm[0].frames) > 2 and addmm[0].frames[0].file.endswith("linear.py")
    assert Graph.from_json(g.to_json()) == g
    grouped = g.groups(budget=1, by="line")
    assert any(
        k.startswith(f"test_graph.py:{here + 3} › ") for gr in grouped.groups for k, _ in gr.sources
    )


def test_profiler_scopes_group_the_graph_when_code_opens_them():
    import torch_xla.debug.profiler as xp

    dev = tpu_nb.device()
    x = torch.randn(4, 4, device=dev)
    torch_xla.sync()
    with record_locations():
        with xp.Trace("encoder"):
            h = (x @ x).relu() * 2 + 1
        with xp.Trace("decoder"):
            y = (h @ h).tanh() - 1
    g = graph(y)
    assert {n.scope.split("/")[0].split(".")[0] for n in g.nodes} == {"encoder", "decoder"}
    # A named region is a part of the model like a module is: grouped as one by default
    assert {gr.key for gr in g.groups(budget=6).groups} >= {"forward:encoder", "forward:decoder"}
    grouped = g.groups(budget=6, by="scope")
    labels = [gr.sources[0][0] for gr in grouped.groups]
    assert any(k.startswith("scope encoder") for k in labels)
    assert any(k.startswith("scope decoder") for k in labels)
