# An allocation past the memory limit fails as MemoryError, in the code; the
# interpreter lives on with its state.
# status: failed
# error: MemoryError
bytearray(1 << 40)
