"""Optional integrations with other libraries, each importing its library only when used.

- :mod:`functional_mesh.integrations.torchtitan`: torchtitan's ``ParallelDims`` whose meshes are
  one functional_mesh family (install the ``torchtitan`` extra).
"""
