# Replaces builtins the server calls (repr, len, isinstance, str, print): the
# server looks them up in its own copy.
# status: succeeded
# next-code: __import__("builtins").repr is None
# next-status: succeeded
import builtins
builtins.repr = None
builtins.len = None
builtins.isinstance = None
builtins.print = None
builtins.compile = None
