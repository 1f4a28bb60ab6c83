"""An offline stand-in for the Anthropic Messages API, scripted by the user's last message.

Run it with ``python -m offline_model --port 8765`` or, in tests and benchmarks, with
``offline_model.testing.start_offline_model()``. The script language is described in
``script.py``; the wire format in ``render.py``; timing, faults and control endpoints in ``server.py``.
"""
