"""The gateway's domain: blocks, named graphs, the inference-server registry and the request log.

A block publishes a deployment or a model version under an id (``blocks``, resolved to what it
runs now by ``versions``); a named graph (``named_graphs``, checked by ``graphs``) wires blocks
together; ``inference_servers`` is the seed's registry of servers and the blocks each
publishes, queried with MongoDB-style filters (``mongo``); ``request_log`` is the seed's
``block_inference`` log. It lives below both the gateway and the api, which serve it.
"""
