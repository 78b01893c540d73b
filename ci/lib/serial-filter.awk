# Filter for the guest's serial console (ci/vm): copy it to stdout line by
# line, and send protocol lines (those containing the per-run token `tok`) and
# a kernel panic notice to stderr, which ci/vm reads as its event channel.
# Run with `mawk -W interactive` so that nothing is held back in buffers.

{ sub(/\r$/, "") }

index($0, tok) > 0 {
    i = index($0, tok)
    # Output without a trailing newline can share a line with the marker.
    if (i > 1) { print substr($0, 1, i - 1); fflush() }
    print substr($0, i + length(tok)) > "/dev/stderr"
    fflush("/dev/stderr")
    next
}

/Kernel panic/ { print "panic" > "/dev/stderr"; fflush("/dev/stderr") }

# The one kernel message a clean power-off always prints.
/^\[ *[0-9]+\.[0-9]+\] reboot: Power down$/ { next }

{ print; fflush() }
