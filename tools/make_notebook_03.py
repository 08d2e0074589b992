"""Writes notebooks/03_lazy_tensors.ipynb (sources only; see make_notebook_common.py)."""

from make_notebook_common import code, md, setup_cells, write

cells = [
    md("""
        # 03 · Lazy tensors: the pending graph, syncs and recompilation

        PyTorch on a CPU or GPU is *eager*: each operation runs when Python reaches it. On an XLA
        device, operations are *lazy*: they are recorded into a graph that runs later, as a
        whole. Most surprises on a TPU (slow steps, a notebook that compiles forever, a print
        that takes seconds) come from forgetting that.

        **You will learn**

        - how to look at the pending graph, and where each of its operations came from;
        - why printing a tensor or calling `.item()` forces the graph to compile and run, and why
          doing it inside a loop is slow;
        - why changing shapes recompiles, how the `%%on_tpu` report shows it, and how padding
          and bucketing fix it;
        - how `--max-graphs` turns silent recompilation into an error at the step that caused it.
    """),
    *setup_cells("%tpu_setup --ir-debug", why="""
        ## Set-up, with source locations

        `--ir-debug` makes torch_xla record, for every operation in the graph, the Python line
        that created it. It costs a little time while recording, so it is off by default; turn it
        on when you want to read graphs.
    """),
    md("""
        ## The pending graph

        Nothing below runs: the four operations are recorded. torch_xla can show what it has
        recorded for a tensor, as text: one line per operation (`%3 = ... aten::mul(...)`), its
        inputs, its shape, and with `--ir-debug` the line of the cell it came from.
        `xla::device_data` nodes are the inputs: data already on the device.
    """),
    code("""
        import torch
        import torch_xla

        dev = torch_xla.device()
        x = torch.tensor([1.0, 2.0, 3.0]).to(dev)
        y = (x * 2 + 1).relu().sum()
        print(torch_xla._XLAC._get_xla_tensors_text([y]))
    """),
    md("""
        Notice the two kinds of scalar. The `2` became `xla::device_data`, an *input* of the
        graph: multiplying by `3` instead would reuse the same compiled graph. The `1` (of `+ 1`,
        and the hidden `alpha=1` of `add`) became `prim::Constant`: torch_xla bakes 0 and 1 into
        the graph because they enable simplifications.

        The text dump is the raw material; `%xla_graph y` draws it. Each box is a node, coloured
        by kind (device data and constants, compute, reductions), with shapes on the edges;
        hover over a node to see its operation, its shape and the line that created it. The IR
        text and the HLO are under the picture. (`tpu_nb.graph(y)` gives the same graph as
        data, and `%%on_tpu --graph` shows a cell's pending graph just before it runs.)
    """),
    code("""
        %xla_graph y
    """),
    md("""
        `torch_xla.sync()` compiles and runs everything pending. Afterwards `y` is no longer a
        recipe: it is a single `device_data` node, a result that lives on the device.
    """),
    code("""
        torch_xla.sync(wait=True)
        print(torch_xla._XLAC._get_xla_tensors_text([y]))
    """),
    md("""
        ## Printing forces the graph to run

        A printed tensor needs its values, and the values do not exist until the graph runs. So
        `print(z)` makes torch_xla compile the graph that computes `z` **now**, run it, wait for
        it, and copy the result to the host. The report shows that compile on the print's line,
        with the cause torch_xla gives: *user code trying to access tensor value before
        torch_xla.sync*. The rest of the cell is compiled separately at the end of the cell.

        This is fine once, for a look. Note the side effect, though: a print in the middle of
        your code cuts the graph in two, so adding a debugging print changes which graphs get
        compiled.
    """),
    code("""
        %%on_tpu
        z = x.exp()
        print(z)                      # compiles and runs the graph for z, then copies it
        w = (z * 3).mean()            # recorded; runs at the end of the cell
    """),
    md("""
        ## `.item()` in a loop: a wait at every iteration

        `.item()` is a print without the printing: it reads one value on the host, so it runs
        the pending graph and waits for it. Inside a loop, that is one graph execution **plus a
        full round trip** per iteration, and the device sits idle while Python continues. In a
        training loop it also ends the overlap between the device running step *n* and Python
        recording step *n + 1*.
    """),
    code("""
        batches = [(torch.arange(12.0).reshape(4, 3) + i).to(dev) for i in range(5)]
    """),
    code("""
        %%on_tpu
        readings = []
        for batch in batches:
            readings.append((batch * 2).sum().item())      # a host read per iteration
        readings
    """),
    md("""
        Five executions and five host reads for five numbers. The fix is to keep the results on
        the device and read them **once**: collect device tensors, and transfer them together at
        the end.
    """),
    code("""
        %%on_tpu
        sums = torch.stack([(batch * 2).sum() for batch in batches])   # recorded on the device
        sums.tolist()                                                  # one read, at the end
    """),
    md("""
        One execution, one read. In a training loop, the same idea: accumulate the loss in a
        device tensor and read it once per epoch (as [02](02_training.ipynb) does), or log from a
        step closure (`torch_xla.core.xla_model.add_step_closure`), which runs after the step's
        graph has executed instead of cutting it.

        ## New shapes, new compiles

        A compiled graph is specialized to its input shapes. A model fed sentences of different
        lengths sees a new shape for every new length, and each new shape is a new graph to
        compile. On a TPU a compile can take seconds to minutes, so a loop over variable-length
        data can spend nearly all its time compiling.

        Six sentences, four distinct lengths:
    """),
    code("""
        torch_xla.manual_seed(0)
        embed = torch.nn.Embedding(100, 16).to(dev)
        lengths = (5, 9, 5, 12, 9, 7)
        sentences = [torch.arange(n) % 100 for n in lengths]          # token ids, on the CPU


        def mean_embedding(tokens):
            return embed(tokens).mean(dim=0)
    """),
    code("""
        %%on_tpu
        for tokens in sentences:
            vector = mean_embedding(tokens.to(dev))
            torch_xla.sync()
    """),
    md("""
        The report says **RECOMPILED**: line 4 compiled four different graphs, one per length
        (the repeated lengths 5 and 9 were cache hits). tpu_nb tracks which graphs each line has
        compiled and flags a line that keeps producing new ones.

        ### The fix: pad to fixed sizes, and mask

        Pad every sentence to a fixed length and pass a *mask* (1 for real tokens, 0 for
        padding) so the padding does not change the result. Padding is data preparation, so it
        happens on the host (in a real pipeline, in the `DataLoader`'s `collate_fn`).

        Padding everything to the longest possible length wastes compute on short inputs.
        **Bucketing** is the compromise: pad each input up to the next of a few sizes (here
        multiples of 8), so there are only a few graphs, each compiled once.
    """),
    code("""
        import torch.nn.functional as F


        def pad_to_bucket(tokens, bucket=8):
            \"\"\"Pad `tokens` up to a multiple of `bucket`; the mask marks the real tokens.\"\"\"
            size = -(-len(tokens) // bucket) * bucket
            ones = torch.ones(len(tokens), device="cpu")       # data preparation: on the host
            mask = F.pad(ones, (0, size - len(tokens)))
            return F.pad(tokens, (0, size - len(tokens))), mask


        def mean_embedding_masked(tokens, mask):
            return (embed(tokens) * mask[:, None]).sum(dim=0) / mask.sum()


        padded = [pad_to_bucket(tokens) for tokens in sentences]
        print("padded lengths:", [len(tokens) for tokens, _ in padded])
    """),
    code("""
        %%on_tpu
        for tokens, mask in padded:
            vector = mean_embedding_masked(tokens.to(dev), mask.to(dev))
            torch_xla.sync()
    """),
    md("""
        Two graphs for two buckets, where the unpadded loop compiled four, and a sentence of any
        length up to 16 now reuses one of them. The report still marks the line RECOMPILED:
        tpu_nb flags every line that compiles more than one graph, because it cannot know that
        two are deliberate here. `--max-graphs`, below, is how you state what you expect.

        The mask makes the result exactly what the unpadded version computes:
    """),
    code("""
        tokens, mask = pad_to_bucket(sentences[3])
        unpadded = mean_embedding(sentences[3].to(dev))
        bucketed = mean_embedding_masked(tokens.to(dev), mask.to(dev))
        print("same result:", torch.allclose(unpadded.cpu(), bucketed.cpu(), atol=1e-6))
    """),
    md("""
        ## `--max-graphs`: make recompilation an error

        A report after the fact is good; failing at the step that goes wrong is better when you
        *know* how many graphs a loop should compile. `%%on_tpu --max-graphs N` raises
        `tpu_nb.RecompilationError` as soon as the steps of the cell trace more than `N`
        distinct graphs, and says what changed. (In a script: `with tpu_nb.max_graphs(N):`.)

        With at most two graphs allowed, the unpadded loop fails at its third length. The error
        names the operation whose shape changed; this cell is *expected* to fail:
    """),
    code("""
        %%on_tpu --max-graphs 2
        for tokens in sentences:
            vector = mean_embedding(tokens.to(dev))
            torch_xla.sync()
    """, "raises-exception"),
    md("""
        The bucketed loop stays within its two graphs, so the same guard passes (and both are
        already in the cache: `0 compiled`). Inside a `--max-graphs N` cell the report also
        accepts up to `N` graphs per line instead of marking them RECOMPILED:
    """),
    code("""
        %%on_tpu --max-graphs 2
        for tokens, mask in padded:
            vector = mean_embedding_masked(tokens.to(dev), mask.to(dev))
            torch_xla.sync()
    """),
    md("""
        ## Summary

        - Operations on XLA tensors are recorded into a pending graph;
          `torch_xla._XLAC._get_xla_tensors_text([t])` shows it, and `--ir-debug` adds the
          source line of each operation.
        - Anything that needs a value on the host (printing, `.item()`, `.tolist()`, `bool()`,
          `if tensor:`) compiles and runs the pending graph and waits for it. Keep results on the
          device and read them once.
        - A compiled graph is specialized to shapes: new shapes mean new compiles. Pad to fixed
          sizes, or bucket to a few sizes, on the host, with a mask.
        - `%%on_tpu` reports recompilation per line; `--max-graphs N` (or `tpu_nb.max_graphs(N)`)
          fails at the step that exceeds `N` graphs.

        **Next:** [04 · Multiple devices](04_multiple_devices.ipynb): data parallelism, with
        one process per device or with SPMD.
    """),
]

write("03_lazy_tensors", cells)
