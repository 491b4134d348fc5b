# Patches json's functions and its C encoder hook.
# status: succeeded
import json, json.encoder, json.decoder
json.dumps = lambda *a, **k: "garbage"
json.loads = lambda *a, **k: 1 / 0
json.encoder.c_make_encoder = None
json.JSONEncoder.encode = lambda *a, **k: "garbage"
json.JSONDecoder.decode = lambda *a, **k: 1 / 0
