"""Settings: the frozen CheckConfig and the [tool.gradtool] loader."""
