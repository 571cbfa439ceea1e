"""RecoverSSM: the state cache that owns a RecoverSSM stack's persistent pool and verify-record
workspace (:class:`~recoverssm_rs.recoverssm.state_cache.StateCache`, needs torch) and the torch
reference of its recurrence (:mod:`.recurrence`).

Nothing here is imported with the package: ``recoverssm_rs.StateCache`` loads the cache on first use.
"""
