"""Speculative decoding's recurrent state (RecoverSSM): the state cache that owns a RecoverSSM
stack's persistent pool and verify-record workspace (:class:`~recoverssm_rs.speculative.state_cache.StateCache`, needs torch) and the
torch reference of its recurrence (:mod:`.recurrence`).

Nothing here is imported with the package: ``recoverssm_rs.StateCache`` loads the cache on first use.
This subpackage was ``recoverssm_rs.recoverssm`` before 0.2.0; that path still imports in 0.2.0, with a
:class:`DeprecationWarning`, and is removed in 0.3.0.
"""
