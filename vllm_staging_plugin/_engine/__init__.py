"""The engine room: everything ``register()`` brings into a vLLM process (front end, engine core, workers).

Rules for this subpackage (tested in ``tests/test_engine_footprint.py``):

* it never imports :mod:`vllm_staging_plugin._offline` (the operator's tools);
* with no ``STAGING_PLUGIN_*`` variable set it pre-sizes and does nothing else: no store round-trip, no
  collective, no pluggy, no receipt, no NVML, nothing written, no hook left once it has fired;
* :mod:`.policies` (pluggy), :mod:`.agreement` and the receipt modules are imported only when the variable
  that asks for them is set.

The modules by when they load: :mod:`.settings`, :mod:`.installer`, :mod:`.import_hook`, :mod:`.compat`,
:mod:`.runner_guard`, :mod:`.wrapping` at ``register()``; :mod:`.patch`, :mod:`.staging`, :mod:`.sizing`
when vLLM imports ``cudagraph_utils``; the opt-in ones on first use.
"""
