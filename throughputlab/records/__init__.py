"""The on-disk records: every schema a file holds, on one strict base (:class:`~.base.Record`).

- :mod:`.base`: ``Record``, the time stamps and the atomic write every saved file goes through;
- :mod:`.profile`: the profile and its points (:mod:`.profile_frames`: its pandas views);
- :mod:`.machine`: the hardware and environment a profile was measured on; :mod:`.topology`,
  :mod:`.collectives`: how the devices are connected and the collective benchmark;
- :mod:`.layout`: the parallel layout of a point; :mod:`.distributed`: the ranks' job file and
  side file; :mod:`.settings`: the bench spec a profile stores;
- :mod:`.fit`: the parts of a stored fit; :mod:`.peaks`: the datasheet table.

These modules import nothing of throughputlab but leaf modules (errors, files, models.spec),
so every other part may import them (tests/test_layering.py keeps it so). Probing the machine
(throughputlab.hardware), recording the environment (throughputlab.machine) and fitting
(throughputlab.fit) happen above this layer.
"""
