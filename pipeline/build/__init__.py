"""Build stage: turn a build description into a raw wheel, on this host or in the builder image."""
