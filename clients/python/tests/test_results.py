"""Rich results and changed files of a run, through the data plane."""

import base64

import warmpool

CODE = """
class Rich:
    def __repr__(self): return 'Rich()'
    def _repr_html_(self): return '<b>rich</b>'
print('before')
display(Rich())
print('after')
with open('out/report.txt', 'w') as f:
    f.write('hello')
import matplotlib.pyplot as plt
plt.plot([1, 2, 3], [2, 4, 8])
Rich()
"""


def test_rich_results_files_and_a_chart(sandbox):
    sandbox.files.write("out/old.txt", "unchanged")
    seen = []
    ex = sandbox.run_code(CODE, on_stdout=lambda d: seen.append(d),
                          on_result=lambda r: seen.append(r))
    assert ex.ok, ex.error
    # Streamed in order: the display() between the prints, then the last
    # expression (main), then the figure left open.
    kinds = [x if isinstance(x, str) else x.formats() for x in seen]
    assert kinds[0] == "before\n" and kinds[1] == ["html"] and "".join(k for k in kinds if isinstance(k, str)) == "before\nafter\n"
    assert [r.formats() for r in ex.results] == [["html"], ["html"], ["png"]]
    display, main, chart = ex.results
    assert not display.is_main_result and main.is_main_result and main.html == "<b>rich</b>" and main.text == "Rich()"
    assert main._repr_html_() == "<b>rich</b>" and repr(main) == "Result(text, html, main)"
    png = base64.b64decode(chart.png)
    assert png.startswith(b"\x89PNG\r\n") and chart._repr_png_() == png and chart.text.startswith("<Figure size")
    assert ex.text == "Rich()"
    # The files the run created or changed, and nothing else.
    assert ex.files == [warmpool.FileChange("out/report.txt", 5, True)]
    assert sandbox.files.read("out/report.txt") == "hello"
    # A value with no rich form is the result, with no rich result.
    ex = sandbox.run_code("6 * 7")
    assert ex.text == "42" and ex.results == [] and ex.files == []
