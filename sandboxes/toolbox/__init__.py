"""The in-sandbox toolset runner: the tools of `agent_toolset_20260401`, run inside a sandbox.

Standard library only (Python >= 3.10): it is copied into every sandbox and runs there. `daemon` owns
a persistent bash and serves tool calls, as the sandbox user, on a unix socket its launcher listens on;
in docker that is `supervisor`, the container's first process (root), and `client` is the relay a
provider runs once per call (root too, checking that root listens). The host side only imports
`bundle` (the files to copy in and the commands), `client` (the paths) and `schema` (the tools' one
table of definitions, and the check of an input against it).
"""
