import './base.css';
import 'uplot/dist/uPlot.min.css';
