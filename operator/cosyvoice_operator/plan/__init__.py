"""Planning, pure: spec + observed world -> desired objects, status and typed effects
(one service's pass, the state of an engine, a namespace's engine cleanup, serving, peering).
No I/O, no clock reads: time comes in as an argument."""
