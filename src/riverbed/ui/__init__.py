"""riverbed ui: the web console over the read model (riverbed.inspect)."""
