"""Chapter 7's measurement (`step07_serving`): its bench over HTTP and the report drawn from its results."""
