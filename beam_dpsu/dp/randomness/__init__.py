"""Keyed randomness: the keyed PRF SipHash-2-4 (``siphash``; its constants ``sip_state``, its
compiled kernels ``array_kernels`` behind ``compiled``, and byte ``buffers``), the noise
samplers and run keys (``noise``) and the exact keyed Bernoulli trials that decide a release
(``release_rules``).

It imports only ``beam_dpsu.dp.privacy``.
"""
