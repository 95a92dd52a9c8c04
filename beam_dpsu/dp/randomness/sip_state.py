"""SipHash-2-4's initial-state constants (the bytes of "somepseudorandomlygeneratedbytes"),
declared once for both implementations of the keyed PRF: the numpy one (``siphash``) and the
compiled one (``array_kernels``), which import them from here."""

__all__ = ["C0", "C1", "C2", "C3"]

C0, C1, C2, C3 = (0x736F6D6570736575, 0x646F72616E646F6D, 0x6C7967656E657261,
                  0x7465646279746573)
