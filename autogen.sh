#!/bin/sh
# Generates configure and the Makefile templates from a git checkout.
# Release tarballs (make dist) already contain them and need none of this.
set -e
cd "$(dirname "$0")"
autoreconf -fi
