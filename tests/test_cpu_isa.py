"""XLA:CPU code generation pinned across x86 hosts (fedjax_mtl.cpu_isa)."""

import pytest

from fedjax_mtl import cpu_isa


@pytest.fixture
def x86_avx2(monkeypatch):
  monkeypatch.setattr(cpu_isa.platform, 'machine', lambda: 'x86_64')
  monkeypatch.setattr(cpu_isa, '_has_avx2', lambda: True)
  monkeypatch.setenv('XLA_FLAGS', '--xla_backend_optimization_level=0')


def test_pin_adds_the_cap_to_xla_flags_once(x86_avx2, monkeypatch):
  import os
  assert cpu_isa.pin('AVX2')
  assert os.environ['XLA_FLAGS'] == ('--xla_backend_optimization_level=0 '
                                     '--xla_cpu_max_isa=AVX2')
  assert not cpu_isa.pin('AVX')  # a cap already set (by the user or before) wins
  assert os.environ['XLA_FLAGS'].count('xla_cpu_max_isa') == 1


def test_pin_leaves_native_other_machines_and_old_cpus_alone(x86_avx2, monkeypatch):
  import os
  assert not cpu_isa.pin('native')
  monkeypatch.setattr(cpu_isa, '_has_avx2', lambda: False)
  assert not cpu_isa.pin('AVX2') and cpu_isa.pin('AVX')
  monkeypatch.setenv('XLA_FLAGS', '')
  monkeypatch.setattr(cpu_isa.platform, 'machine', lambda: 'aarch64')
  assert not cpu_isa.pin('AVX2') and os.environ['XLA_FLAGS'] == ''
  with pytest.raises(ValueError, match="unknown cpu isa 'AVX3'; valid choices: native"):
    cpu_isa.pin('AVX3')
