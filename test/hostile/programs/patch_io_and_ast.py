# Replaces io's classes and ast.parse.
# status: succeeded
import io, ast
io.TextIOWrapper = None
io.FileIO = None
ast.parse = None
