"""Envoy ext_proc: the EPP's protocol layer (live shell).

gen/       protobuf classes generated from protos/ (python protos/generate.py)
messages   building and reading ext_proc messages
headers    the headers the EPP reads, writes and strips
openai     OpenAI-style request bodies
usage      token usage in responses; restoring a rewritten model name
events     what the stream machine hands out
stream     one Process stream as a sans-I/O state machine
server     the ExternalProcessor service: a Process call fed to a stream machine
"""
