"""The host side: where tunelab keeps its state and how it reaches the machine it runs on.

- :mod:`tunelab.host.paths` - the ``.tunelab`` home and its folders; :mod:`tunelab.host.runtime` - the vLLM
  runtimes (venvs) and their facts; :mod:`tunelab.host.models` - local model folders (tiny test models).
- :mod:`tunelab.host.slot_holders` - device locks and who holds a slot; :mod:`tunelab.host.run_records` - the
  records of runs on this host; :mod:`tunelab.host.cancel_watch` - cancelling a running sweep.
- :mod:`tunelab.host.prefect_env` - the Prefect server and settings; :mod:`tunelab.host.offline_register` -
  registering a runtime installed from an offline bundle.
"""
