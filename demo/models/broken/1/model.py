# Fails to load on purpose: the demo's model that never becomes READY.
raise RuntimeError("boom: this sample model fails to load on purpose")
