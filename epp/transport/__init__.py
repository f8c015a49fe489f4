"""gRPC over HTTP/2 on the event loop: the ext_proc and health transport."""
