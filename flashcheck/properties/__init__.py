"""The families' properties and how they run: the runner (`runner`: check / check_all inside
Hypothesis tests), one module per family (`softmax`, `attention/`), and what a failure may mean
besides a wrong number: a device or launch limit (`limits`), a refused undeclared feature
(`refusals`), a case fitted to the declarations (`fit`)."""
