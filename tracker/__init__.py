"""The prediction domain: states, durable store, lifecycle.

tracker owns what a prediction *is* and how it may change. It imports neither ``api`` nor
``director``; both of those call into it.
"""
