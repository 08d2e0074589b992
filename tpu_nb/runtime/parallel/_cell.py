"""A notebook cell's code as a function of the replica index (`%%on_tpu --replicas`)."""

from __future__ import annotations

import ast
import linecache

from tpu_nb.runtime.environment._defaults import default_device


class CellFunction:
    """A notebook cell's code as a function of the replica index, with the variables it uses.

    Picklable by value (the worker path sends it to a fresh process): the source, not the
    code object, and only the user variables the code names.
    """

    def __init__(self, source: str, filename: str, variables: dict):
        self.source, self.filename, self.variables = source, filename, variables

    # Names of a notebook namespace that are IPython's own, never sent to a replica.
    HIDDEN = frozenset({"In", "Out", "get_ipython", "exit", "quit"})

    @classmethod
    def from_namespace(
        cls, source: str, filename: str, namespace: dict, codes: tuple = ()
    ) -> CellFunction:
        """The cell with the variables of `namespace` its code (compiled as `codes`, else
        compiled from `source`) names: user variables only, not IPython's or private ones."""
        codes = tuple(c for c in codes if c is not None) or (compile(source, filename, "exec"),)
        used = set().union(*(names_used(c) for c in codes))
        variables = {
            n: namespace[n]
            for n in used
            if n in namespace and n not in cls.HIDDEN and not n.startswith("_")
        }
        return cls(source, filename, variables)

    def compiled(self):
        """The cell as (statements, last expression or None), compiled under its filename,
        with its source registered for tracebacks (a fresh worker has not seen the cell)."""
        linecache.cache[self.filename] = (
            len(self.source),
            None,
            self.source.splitlines(True),
            self.filename,
        )
        tree = ast.parse(self.source, self.filename)
        last = tree.body[-1] if tree.body else None
        expression = None
        if isinstance(last, ast.Expr):
            tree.body.pop()
            expression = compile(ast.Expression(last.value), self.filename, "eval")
        return compile(tree, self.filename, "exec"), expression

    def __call__(self, index: int):
        return self.run(self.compiled(), index)

    def run(self, compiled: tuple, index: int, **names):
        """Run the cell as `compiled` (`compiled()`'s pair) with `index` and `names` defined."""
        statements, expression = compiled
        namespace = {"__name__": "__main__", **self.variables, "index": index, **names}
        # As in %%on_tpu: the replica's device by default, for the cell's own code only.
        with default_device(code=compiled):
            exec(statements, namespace)
            return eval(expression, namespace) if expression is not None else None


def names_used(code) -> set[str]:
    """Global names a code object (and the functions and classes it defines) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            names |= names_used(const)
    return names
