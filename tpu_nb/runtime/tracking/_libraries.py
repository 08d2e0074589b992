"""Advice for a site inside a library: the knob that library offers, by its setting's name.

A loop inside `trainer.train()` or `model.generate()` is not the user's to edit: "accumulate
losses in a tensor" or "pad the batch" names nothing a Trainer user can change. When a site
(provenance.Site: the cell's line, the function it called, the library frame that did it) is
inside a library tpu_nb knows, the fix is that library's setting; inside one it does not know,
the advice names the library's line and says the read or recompile is the library's. Sites
are matched by their frames' files, so nothing here imports a library.
"""

from __future__ import annotations

import weakref

from tpu_nb.runtime.backend import current as current_backend
from tpu_nb.runtime.sources import innermost_frame, is_library, short_path
from tpu_nb.runtime.units import format_place

TRAINER_PAD_FIX = (
    "Trainer's batches change shape from step to step (the data collator pads each batch to "
    "its longest sequence), so each step compiles a new graph: pad to a few fixed sizes, "
    "e.g. DataCollatorWithPadding(tokenizer, pad_to_multiple_of=64), or to one fixed length "
    '(the tokenizer\'s padding="max_length", max_length=...)'
)
TRAINER_LAST_BATCH_FIX = (
    "only the last step compiled a new graph: when that is Trainer's shorter last batch, "
    "TrainingArguments(dataloader_drop_last=True) drops it"
)
TRAINER_HOST_FIX = (
    "the host's Python tracing of Trainer's step takes longer than the device's work: give "
    "each step more work, a larger TrainingArguments(per_device_train_batch_size=...) (the "
    "tracing stays the same, the device's work grows with the batch)"
)
TRAINER_LOG_FIX = (
    "Trainer reads the loss on the host to log it: a larger "
    "TrainingArguments(logging_steps=...) reads it less often"
)
_SYNC_PER_TOKEN = (
    "sync once per token, e.g. with a LogitsProcessor whose __call__ runs torch_xla.sync() "
    "and returns the scores (model.generate(..., logits_processor=LogitsProcessorList([...])))"
)
_STATIC_CACHE = (
    "generate()'s default dynamic cache grows the key/value tensors by one token per step: "
    'use a static cache, model.generate(..., cache_implementation="static") with a fixed '
    "max_new_tokens"
)
_NO_SYNC = (
    "generate() calls no torch_xla.sync() between tokens, so each token's graph also holds "
    "the ones before it"
)
# What no setting of generate() changes: what stays of its compiles once the rest is done
GENERATE_LENGTH_FIX = (
    "generate() appends each token to input_ids and the attention mask, a new shape per "
    "token whatever the cache: each length compiles once, and a later generate() with the "
    "same prompt length and max_new_tokens runs those graphs from the cache: pad the prompts "
    'to one length (tokenizer(..., padding="max_length", max_length=...))'
)
# by (whether its graphs update a static cache, whether code of the user's syncs inside it)
GENERATE_FIXES = {
    (False, False): f"{_STATIC_CACHE}; {_NO_SYNC}: {_SYNC_PER_TOKEN}. Then {GENERATE_LENGTH_FIX}",
    (True, False): f"{_NO_SYNC} (the static cache fixes the cache's shape, not that): "
    f"{_SYNC_PER_TOKEN}. Then {GENERATE_LENGTH_FIX}",
    (False, True): f"{_STATIC_CACHE}. Then {GENERATE_LENGTH_FIX}",
    (True, True): GENERATE_LENGTH_FIX,
}
GENERATE_FIX = GENERATE_FIXES[(False, False)]
MASK_CHECK_FIX = (
    "transformers' SDPA attention checks the attention mask on the host every forward "
    "(torch.all(mask == 1)), which waits for the step's work: load the model with "
    'attn_implementation="eager", or pass no attention_mask when nothing is padded'
)

SCHEDULER_TIMESTEPS_FIX = (
    "diffusers' scheduler compares and indexes with the timestep on the host in each step(), "
    "so with its timesteps on the device every step waits for the device: keep them on the "
    "host, scheduler.set_timesteps(num_inference_steps) without device= (as diffusers' own "
    "pipelines do), and pass each t as it is: the UNet copies it to the device with the "
    "step's inputs"
)

MESH_REDUCE_FIX = (
    "xm.mesh_reduce copies the value to the host and syncs to exchange it between processes: "
    "call it every few steps or after the loop, or reduce on the device (xm.all_reduce) and "
    "read the result once"
)
# torch_xla's host rendezvous: Trainer logs through it (its knob), others call it themselves
_RENDEZVOUS = "torch_xla/core/xla_model.py"
# (file of the site's own frame, functions or "" for any) -> the knob, for reads
_READS = (
    ("transformers/modeling_attn_mask_utils.py", "", MASK_CHECK_FIX),
    ("transformers/masking_utils.py", "", MASK_CHECK_FIX),
    ("transformers/trainer.py", "_maybe_log_save_evaluate", TRAINER_LOG_FIX),
)
# (folder of the site's own frame) -> the knob, for reads: every scheduler of diffusers
_READS_IN = (("diffusers/schedulers/", SCHEDULER_TIMESTEPS_FIX),)
_GENERATE = "transformers/generation/utils.py"
# file of the function the line called (or of a frame below it) -> the knob, for recompiles
_RECOMPILES = {_GENERATE: GENERATE_FIX, "transformers/trainer.py": TRAINER_PAD_FIX}
# A static cache writes each token's keys and values into its fixed tensors in place
# (StaticLayer.update's index_copy_); the dynamic cache concatenates them.
_STATIC_CACHE_OP = "aten::index_copy"


# A library's logging, which syncs between two training steps: torch_xla's host rendezvous
# (xm.mesh_reduce, xm.rendezvous: Trainer gathers the loss through them), Trainer's log
# step, accelerate's gather (Trainer's count of a causal LM batch's tokens,
# num_items_in_batch, at each step) and Trainer's evaluation loop (its sync after each
# batch's forward; its device loader's syncs are the batches'). Their syncs are work of the
# step they are in, not steps: (file, function) of the function that called the sync
# (through xm.mark_step or torch_xla.sync).
_HOUSEKEEPING = (
    ("accelerate/utils/operations.py", "_tpu_gather"),
    ("torch_xla/core/xla_model.py", "xla_rendezvous"),
    ("torch_xla/core/xla_model.py", "rendezvous"),
    ("torch_xla/core/xla_model.py", "mesh_reduce"),
    ("transformers/trainer.py", "_maybe_log_save_evaluate"),
    ("transformers/trainer.py", "evaluation_loop"),
)
_LOGGING_DEPTH = 32  # frames a device loader's first sync looks out for a library's logging
_PASS_THROUGH = (
    ("torch_xla/core/xla_model.py", "mark_step"),
    ("torch_xla/torch_xla.py", "sync"),
    ("typing_extensions.py", "wrapper"),  # @deprecated, around xm.mark_step
    ("warnings.py", "wrapper"),
)
# id(code) -> (code, answer): True, False or None (a pass-through: ask its caller). The code
# is kept so that its id is not reused while the entry lives.
_housekeeping: dict[int, tuple] = {}


def housekeeping_sync(frame) -> bool:
    """Whether a sync called from `frame` (the sync's caller) is a library's logging: a
    rendezvous or Trainer's log step, a sync between two training steps that is no step of
    its own (the step count is that of the optimizer's steps). A few dict lookups."""
    code = frame.f_code  # the caller itself, mostly: no walk, and known (inlined lookup)
    known = _housekeeping.get(id(code))
    answer = known[1] if known is not None and known[0] is code else _housekeeping_answer(code)
    if answer is None:  # a pass-through (xm.mark_step): ask the frames outside it
        found = innermost_frame(frame, lambda f: _housekeeping_answer(f.f_code) is not None, 4)
        answer = found is not None and _housekeeping_answer(found.f_code)
    return bool(answer)


# The roles of syncs that a run counts apart from its steps (the step anatomy's loader and
# other syncs); "plumbing" is the sync of a step a compiled function ran.
NO_STEP_ROLES = frozenset({"loader", "empty", "inner"})


def sync_role(event, loaders) -> str:
    """What a sync is to a run, found once for the run's subscribers (the recorder's step
    count and the step anatomy agree): "loader" (a device loader's, with nothing to run),
    "empty" (nothing else to run: a library's after its loop, max_graphs' as it starts with
    nothing pending), "plumbing" (the runtime's own around a compiled function), "inner" (a
    loader's before its first batch, which runs what the code set up before the loop,
    max_graphs' as it starts, which runs what was pending before it, or a library's logging
    between two steps: work of a step, no step) or "step". `loaders`: the run's device
    loader iterators seen so far (a weakref.WeakSet, added to). The caller tells tpu_nb's
    own end-of-run sync apart."""
    if event.role_of is loaders:
        return event.role
    first_batch = event.loader and first_loader_sync(event.frame, loaders)
    if (
        event.launched == 0
        and getattr(loaders, "logged", False)
        and not housekeeping_sync(event.frame)
        and not (event.loader and _in_logging(event.frame, loaders))
    ):
        # a library's logging ran the step's graph and more (Trainer's log step and its
        # evaluation, then the reset of its loss): the first sync of the loop after it that
        # finds nothing to run ends the step that logging was part of
        role = "step"
    elif event.launched == 0 and event.loader:
        role = "loader"
    elif event.launched == 0:
        role = "empty"
    elif event.plumbing:
        role = "plumbing"
    elif (
        first_batch
        or event.own == "guard-start"
        or housekeeping_sync(event.frame)
        or (event.loader and _in_logging(event.frame, loaders))
    ):
        role = "inner"
    else:
        role = "step"
    if isinstance(loaders, Loaders):
        if role == "step":
            loaders.logged = False
        elif role == "inner" and not first_batch and event.own != "guard-start":
            loaders.logged = True
    event.role_of, event.role = loaders, role
    return role


def _housekeeping_answer(code) -> bool | None:
    known = _housekeeping.get(id(code))
    if known is not None and known[0] is code:
        return known[1]
    path, name = code.co_filename.replace("\\", "/"), code.co_name
    answer: bool | None = any(
        path.endswith(file) and name == function for file, function in _HOUSEKEEPING
    )
    if not answer and any(path.endswith(f) and name == fn for f, fn in _PASS_THROUGH):
        answer = None
    if len(_housekeeping) >= 1024:  # bounded: one per function that syncs
        _housekeeping.clear()
    _housekeeping[id(code)] = (code, answer)
    return answer


def first_loader_sync(frame, seen) -> bool:
    """Whether a device data loader's sync called from `frame` is its iterator's first (before
    its first batch: it runs what the code set up before the loop, work of the loop's first
    step). `seen`: a weakref.WeakSet of the iterators seen so far, added to; an iterator a
    library's logging runs (Trainer's evaluation inside train()) is also put in its
    `logging` set, found by one walk at its first sync."""
    iterator = frame.f_locals.get("self") if frame is not None else None
    try:
        if iterator is None or iterator in seen:
            return False
        seen.add(iterator)
    except TypeError:  # not weakly referenceable: not known
        return False
    logging = getattr(seen, "logging", None)
    if logging is not None and innermost_frame(
        frame, lambda f: bool(_housekeeping_answer(f.f_code)), _LOGGING_DEPTH
    ):
        logging.add(iterator)
    return True


class Loaders(weakref.WeakSet):
    """A run's device loader iterators (first_loader_sync), and in `logging` those a library's
    logging runs."""

    def __init__(self) -> None:
        super().__init__()
        self.logging: weakref.WeakSet = weakref.WeakSet()
        self.logged = False  # a library's logging ran work since the last step's sync


def _in_logging(frame, seen) -> bool:
    """Whether a device loader's sync called from `frame` hands out a batch of a library's
    logging (its iterator marked by first_loader_sync): work of a step, no step of its own."""
    logging = getattr(seen, "logging", None)
    if not logging:
        return False
    try:
        return frame.f_locals.get("self") in logging
    except TypeError:
        return False


def _path(frame) -> str:
    return frame.file.replace("\\", "/") if frame is not None else ""


def _library_frame(site):
    """The library frame that did it, when no user code is between it and the line."""
    return site.library if site is not None and site.user is None else None


def _not_at_step_boundary(what: str, site) -> str:
    """`_not_known` for the library frame that did it, unless that is a device loader's step
    boundary or there is none (""). The device loaders sync at the step boundary of a loop
    the user wrote: a recompile there is the user's step changing shape, not a library's."""
    frame = _library_frame(site)
    loaders = current_backend().syncs.loader_paths
    if frame is None or any(part in _path(frame) for part in loaders):
        return ""
    return _not_known(what, frame)


def in_trainer(site) -> bool:
    """Whether the site is inside transformers' Trainer (the line called trainer.train())."""
    entry = getattr(site, "entry", None)
    return _path(entry).endswith(("transformers/trainer.py", "transformers/trainer_seq2seq.py"))


def read_fix(site) -> str:
    """The fix for a per-step read at `site` when a library made it: its knob, else a sentence
    naming the library's line; "" for the user's own reads."""
    frame = _library_frame(site)
    if frame is None:
        return ""
    path = _path(frame)
    if path.endswith(_RENDEZVOUS):
        return TRAINER_LOG_FIX if in_trainer(site) else MESH_REDUCE_FIX
    for file, function, fix in _READS:
        if path.endswith(file) and (not function or frame.function == function):
            return fix
    for folder, fix in _READS_IN:
        if f"/{folder}" in path or path.startswith(folder):
            return fix
    return _not_known("read", frame)


def _known_loop(site) -> str:
    """The file of the known library loop the site is inside ("" : none)."""
    for frame in (getattr(site, "entry", None), getattr(site, "library", None)):
        if frame is not None and is_library(frame.file):
            for file in _RECOMPILES:
                if _path(frame).endswith(file):
                    return file
    return ""


def _generate_fix(ops, user_syncs: bool) -> str:
    return GENERATE_FIXES[(_STATIC_CACHE_OP in ops, user_syncs)]


def recompile_fix(site, ops=frozenset(), user_syncs: bool = False) -> str:
    """The fix for a site that keeps compiling, when it is inside a library: its knob, else
    a sentence naming the library's line; "" for the user's own code. `ops`: those of the
    graphs compiled under the site's line (a static cache needs no advice to use one);
    `user_syncs`: code of the user's that the library calls back syncs (once per token)."""
    loop = _known_loop(site)
    if loop == _GENERATE:
        return _generate_fix(ops, user_syncs)
    return _RECOMPILES[loop] if loop else _not_at_step_boundary("recompile", site)


def last_call_fix(site) -> str:
    """The fix for a site whose last call alone compiled again (a shorter last batch), when
    a library's loop draws the batches or runs the steps (a pipeline's sampling loop); ""
    for the user's own loop, whose batches its data loader draws."""
    if _known_loop(site) == "transformers/trainer.py":
        return TRAINER_LAST_BATCH_FIX
    return _not_at_step_boundary("last call", site)


def growing_fix(site, ops=frozenset(), user_syncs: bool = False) -> str:
    """The fix for a site whose graph grows step after step, when a library's loop runs the
    steps: "call torch_xla.sync() at the end of each step" names code the user did not
    write. "" elsewhere: a graph that grows across a loop the user wrote (the library frame
    below its line a read such as print's) takes the user's sync."""
    return _generate_fix(ops, user_syncs) if _known_loop(site) == _GENERATE else ""


def fallback_fix(site, op: str) -> str:
    """The fix for a CPU fallback a library's code made (its backward's, inside backward():
    the library frame that called the op's forward): a sentence naming the library's line;
    "" for the user's own ops, whose rewrite the generic hint gives."""
    frame = _library_frame(site)
    return _not_known("fallback", frame, op) if frame is not None else ""


def _not_known(what: str, frame, op: str = "") -> str:
    where = f"{format_place(short_path(frame.file), frame.line)} {frame.function}"
    if what == "fallback":
        backward = op.startswith("the backward of ")
        op = op.removeprefix("the backward of ")
        made = f"{op}, whose backward autograd runs on the CPU" if backward else op
        return (
            f"this fallback is the library's: {where} calls {made}; tpu_nb knows "
            "no setting of it that avoids the op: look for one in its documentation, or "
            "replace that call in the library's module"
        )
    if what == "last call":
        return (
            f"only the last step of the library's loop ({where}) compiled a graph of its own: "
            "the library's last step traces other work (a sampler's final step, a shorter "
            "last batch); compiled once, it runs from the cache when the loop runs again with "
            "the same settings, so it costs only a first call"
        )
    if what == "read":
        return (
            f"this read is the library's ({where}), made every step of its loop: tpu_nb knows "
            "no setting of it that removes the read; look for one in its documentation"
        )
    return (
        f"the recompiles are the library's ({where}): the inputs it traces change shape "
        "every step; give it inputs of fixed shapes (pad what you pass it), or look for a "
        "setting of it that does"
    )
