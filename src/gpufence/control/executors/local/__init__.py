"""The local executor: gang members as real processes on this machine."""
