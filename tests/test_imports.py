"""The package's import graph: no cycles, no private name used outside its module
(in fedjax_mtl, scripts/ and benchmarks/; no cycles in benchmarks/ either).

Read from the source (ast), function-level imports included: a module that imports
another inside a function still depends on it.
"""

from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = 'fedjax_mtl'


def _modules(top: str) -> dict[str, str]:
  """{dotted module name: path} of every .py file under `top` (a folder of ROOT)."""
  out = {}
  for d, _, files in os.walk(os.path.join(ROOT, top)):
    for f in files:
      if f.endswith('.py'):
        rel = os.path.relpath(os.path.join(d, f), ROOT)[:-3].replace(os.sep, '.')
        out[rel.removesuffix('.__init__')] = os.path.join(d, f)
  return out


def _resolve(name: str, modules) -> str | None:
  """The package module `name` refers to (a module, or a name inside one)."""
  while name:
    if name in modules:
      return name
    name = name.rpartition('.')[0]
  return None


def imports(path: str, modules) -> list[tuple[str, str | None, int]]:
  """(module, imported name or None, line) of every package import in a file."""
  tree = ast.parse(open(path).read(), path)
  out = []
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      for a in node.names:
        if (m := _resolve(a.name, modules)):
          out.append((m, None, node.lineno))
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
      for a in node.names:
        full = f'{node.module}.{a.name}'
        if full in modules:
          out.append((full, None, node.lineno))
        elif (m := _resolve(node.module, modules)):
          out.append((m, a.name, node.lineno))
  return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components with more than one module (Tarjan)."""
  index, low, stack, on, out = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(graph.get(v, ())):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      comp = []
      while True:
        w = stack.pop()
        on.discard(w)
        comp.append(w)
        if w == v:
          break
      if len(comp) > 1:
        out.append(sorted(comp))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return out


def _graph(modules) -> dict[str, set[str]]:
  graph = {}
  for name, path in modules.items():
    deps = {m for m, _, _ in imports(path, modules)} - {name}
    # A package's __init__ is what `import pkg.sub` runs first: an edge to it from
    # its own submodules is not a cycle of the code.
    graph[name] = {d for d in deps if not name.startswith(d + '.')}
  return graph


def test_the_package_has_no_import_cycle():
  modules = _modules(PACKAGE)
  assert len(modules) > 50
  assert cycles(_graph(modules)) == []


def test_the_benchmarks_have_no_import_cycle():
  modules = {**_modules(PACKAGE), **_modules('benchmarks')}
  assert 'benchmarks.engine' in modules
  assert cycles(_graph(modules)) == []


def test_the_cycle_finder_finds_a_cycle():
  graph = {'a': {'b'}, 'b': {'c'}, 'c': {'a'}, 'd': {'a'}, 'e': set()}
  assert cycles(graph) == [['a', 'b', 'c']]


def test_no_private_name_is_used_outside_its_module():
  modules = {**_modules(PACKAGE), **_modules('scripts'), **_modules('benchmarks')}
  assert 'benchmarks.feddea' in modules
  used = []
  for name, path in modules.items():
    for m, attr, line in imports(path, modules):
      if attr and attr.startswith('_') and m != name:
        used.append(f'{os.path.relpath(path, ROOT)}:{line} imports {m}.{attr}')
    # module._name attribute reads through an imported module alias
    tree = ast.parse(open(path).read(), path)
    aliases = {}
    for node in ast.walk(tree):
      if isinstance(node, ast.Import):
        for a in node.names:
          if a.name in modules:
            aliases[a.asname or a.name] = a.name
      elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for a in node.names:
          if f'{node.module}.{a.name}' in modules:
            aliases[a.asname or a.name] = f'{node.module}.{a.name}'
    for node in ast.walk(tree):
      if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
          and node.value.id in aliases and node.attr.startswith('_')
          and not node.attr.startswith('__') and aliases[node.value.id] != name):
        used.append(f'{os.path.relpath(path, ROOT)}:{node.lineno} reads '
                    f'{aliases[node.value.id]}.{node.attr}')
  assert used == []
