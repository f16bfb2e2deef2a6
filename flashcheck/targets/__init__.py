"""The kernel under test: an author's function turned into a spec from what it declares
(`external`) and what its signature says it takes (`signature`)."""
