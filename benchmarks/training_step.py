"""notebooks/03's training step as rank code, for the benchmarks that time it (mlx_record.py, state_record.py)."""

#: the notebook's data (``Xs``, ``Ys``: this rank's share) and model (an MLP fitting sin), Adam and
#: ``loss_and_grad``; the code around it defines ``mx``, ``nn``, ``optim`` and ``world``
MODEL = """
mx.random.seed(0)
X = mx.random.uniform(-3, 3, (512, 1))
Y = mx.sin(X) + 0.1 * mx.random.normal(X.shape)
Xs, Ys = X[world.rank()::world.size()], Y[world.rank()::world.size()]
class MLP(nn.Module):
    def __init__(self, hidden=32):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(1, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 1)
    def __call__(self, x):
        return self.l3(nn.relu(self.l2(nn.relu(self.l1(x)))))
mx.random.seed(1)
model = MLP()
opt = optim.Adam(learning_rate=0.01)
def loss_fn(model, x, y):
    return nn.losses.mse_loss(model(x), y)
loss_and_grad = nn.value_and_grad(model, loss_fn)
"""
